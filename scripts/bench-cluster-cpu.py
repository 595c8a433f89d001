#!/usr/bin/env python3
"""Runs `agent-relay bench --cluster URL --json ARGS...` and samples /proc CPU times (utime+stime)
of the bench process, its two private relays (relay0: the senders' node, started first) and
nats-server (its pid given), every 50 ms, until the relays stop (the JetStream-alone phase comes
after). Prints the bench's figures and CPU µs per delivered message of each process.

With THREADS=1 in the environment it also prints each relay's CPU µs per delivered message by
thread name (/proc/PID/task/TID/comm: the tokio workers, the store thread...).

Usage: scripts/bench-cluster-cpu.py AGENT_RELAY_BINARY NATS_PID nats://127.0.0.1:PORT [bench args]"""
import os, sys, subprocess, time, json
tck = os.sysconf('SC_CLK_TCK')
def cpu(pid):
    try:
        f = open(f'/proc/{pid}/stat').read()
        parts = f[f.rindex(')')+2:].split()
        return (int(parts[11]) + int(parts[12])) / tck
    except Exception:
        return None
def threads(pid):
    out = {}
    try:
        for t in os.listdir(f'/proc/{pid}/task'):
            try:
                name = open(f'/proc/{pid}/task/{t}/comm').read().strip()
                out[t] = (name, cpu(f'{pid}/task/{t}'))
            except Exception: pass
    except Exception: pass
    return out
def children(pid):
    out = []
    for d in os.listdir('/proc'):
        if d.isdigit():
            try:
                f = open(f'/proc/{d}/stat').read()
                ppid = int(f[f.rindex(')')+2:].split()[1])
                if ppid == pid: out.append(int(d))
            except Exception: pass
    return out
bin_, nats_pid, url = sys.argv[1], int(sys.argv[2]), sys.argv[3]
args = sys.argv[4:]
n0 = cpu(nats_pid)
load0 = open('/proc/loadavg').read().split()[:3]
p = subprocess.Popen([bin_, 'bench', '--cluster', url, '--json'] + args, stdout=subprocess.PIPE)
last = {}; nats_last = n0; bench_last = 0; seen = set(); tlast = {}
while p.poll() is None:
    kids = children(p.pid)
    alive = False
    for k in kids:
        c = cpu(k)
        if c is not None:
            last[k] = c; seen.add(k); alive = True
            if os.environ.get('THREADS'):
                for tid, (name, tc) in threads(k).items():
                    if tc is not None: tlast.setdefault(k, {})[tid] = (name, tc)
    if alive or not seen:
        nats_last = cpu(nats_pid); bench_last = cpu(p.pid) or bench_last
    time.sleep(0.05)
out = json.loads(p.stdout.read())
n = out['delivered'] or 1
ks = sorted(last)
res = {'msgs_per_s': round(out['msgs_per_s']), 'ratio': out.get('ratio_to_jetstream'),
       'js': out.get('jetstream_alone'), 'p50': out['latency_ms']['p50'], 'p99': out['latency_ms']['p99'],
       'lost': out['lost'], 'dup': out['duplicated'], 'load_before': load0,
       'load_after': open('/proc/loadavg').read().split()[:3],
       'us_per_msg': {'bench': round(bench_last*1e6/n,1), **{f'relay{i}({k})': round(last[k]*1e6/n,1) for i,k in enumerate(ks)},
                      'nats': round((nats_last-n0)*1e6/n,1)}}
if os.environ.get('THREADS'):
    res['threads_us_per_msg'] = {}
    for i, k in enumerate(ks):
        by = {}
        for name, tc in tlast.get(k, {}).values():
            by[name] = round(by.get(name, 0) + tc*1e6/n, 1)
        res['threads_us_per_msg'][f'relay{i}'] = by
print(json.dumps(res))
