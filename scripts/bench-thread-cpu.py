#!/usr/bin/env python3
# Usage: scripts/bench-thread-cpu.py target/release/agent-relay [N] [bench options...]
#   e.g. scripts/bench-thread-cpu.py target/release/agent-relay 200000
#        scripts/bench-thread-cpu.py target/release/agent-relay 200000 --acks lean
# Where the CPU goes, per message and per daemon thread: starts a daemon (`up --foreground`,
# default durability, no rate limits) on a temporary directory, reads the CPU time of each of
# its threads from /proc/PID/task/*/stat, runs `bench --target` against it, reads them again,
# and prints microseconds of CPU per message for each thread name, the daemon's total, and the
# load generator's (its rusage). Linux only. CPU time is what the shared machine disturbs least;
# the msgs/s it prints is wall clock and varies with the load (`uptime` is printed too).
import json, os, resource, subprocess, sys, tempfile, time

binary = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
extra = sys.argv[3:]
d = tempfile.mkdtemp(prefix="thrcpu")
sock = os.path.join(d, "r.sock")
env = dict(os.environ, AGENT_RELAY_DATA_DIR=d, AGENT_RELAY_SOCKET=sock, AGENT_RELAY_LOG="warn",
           AGENT_RELAY_DASHBOARD_PORT="0")
p = subprocess.Popen([binary, "up", "--foreground", "--rate-limit", "0", "--pair-rate-limit", "0"],
                     env=env, stderr=open(os.path.join(d, "log"), "w"))
deadline = time.time() + 30
while not os.path.exists(sock):
    if time.time() > deadline or p.poll() is not None:
        sys.exit("the daemon did not start; see " + os.path.join(d, "log"))
    time.sleep(0.02)
time.sleep(0.5)
tck = os.sysconf("SC_CLK_TCK")


def threads():
    out = {}
    for t in os.listdir(f"/proc/{p.pid}/task"):
        try:
            raw = open(f"/proc/{p.pid}/task/{t}/stat").read()
        except FileNotFoundError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        st = raw[raw.rindex(")") + 2:].split()
        out[t] = (name, int(st[11]) + int(st[12]))
    return out


before = threads()
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
b = subprocess.run([binary, "bench", "--target", sock, "-n", str(n), "--json"] + extra, env=env,
                   capture_output=True, text=True)
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
after = threads()
if b.returncode != 0:
    sys.exit("bench failed: " + b.stderr)
res = json.loads(b.stdout)
groups = {}
for t, (name, ticks) in after.items():
    # Threads that started during the run count from zero.
    base = before.get(t, (name, 0))[1]
    groups[name] = groups.get(name, 0) + ticks - base
us = lambda ticks: 1e6 * ticks / tck / n
print(f"load: {open('/proc/loadavg').read().strip()}")
print(f"bench: {json.dumps({k: res[k] for k in res if k in ('msgs_per_s', 'lost', 'duplicated', 'delivered', 'acks')})}")
for name, ticks in sorted(groups.items(), key=lambda kv: -kv[1]):
    if ticks:
        print(f"  {name:20} {us(ticks):6.2f} us/msg")
print(f"  {'daemon total':20} {us(sum(groups.values())):6.2f} us/msg")
gen = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
print(f"  {'load generator':20} {1e6 * gen / n:6.2f} us/msg")
p.terminate()
p.wait()
import shutil
shutil.rmtree(d, ignore_errors=True)
