#!/usr/bin/env python3
# Usage: scripts/bench-many-agents.py target/release/agent-relay 10000
#   env IDLE_SECS (default 20): how long to measure idle CPU; EXTRA_UP: more `up` options.
# Linux: reads the daemon's CPU and memory from /proc.
# N raw agents connect to a private daemon (HELLO, then they answer PINGs); the daemon's
# memory per agent and its CPU while they sit idle; then one broadcast to all, timed from the
# SEND written to the last DELIVER read (one Python reader for all: an upper bound).
import json, os, socket, struct, subprocess, sys, tempfile, time, selectors, resource
binary, n = sys.argv[1], int(sys.argv[2])
idle = float(os.environ.get("IDLE_SECS", "20"))
d = tempfile.mkdtemp(prefix="bc10k")
sock = os.path.join(d, "r.sock")
env = dict(os.environ, AGENT_RELAY_DATA_DIR=d, AGENT_RELAY_SOCKET=sock, AGENT_RELAY_LOG="warn", AGENT_RELAY_DASHBOARD_PORT="0")
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 1000, n + 1000))
p = subprocess.Popen([binary, "up", "--foreground", "--max-connections", str(n + 100)] + os.environ.get("EXTRA_UP", "").split(), env=env, stderr=open(os.path.join(d, "log"), "w"))
while not os.path.exists(sock): time.sleep(0.02)
time.sleep(0.3)
def frame(obj):
    b = json.dumps(obj).encode(); return struct.pack(">I", len(b)) + b
def read_frame(s):
    h = b""
    while len(h) < 4: h += s.recv(4 - len(h))
    (l,) = struct.unpack(">I", h); body = b""
    while len(body) < l: body += s.recv(l - len(body))
    return json.loads(body)
def rss():
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])
def cpu():
    st = open(f"/proc/{p.pid}/stat").read().split(")")[-1].split()
    return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
rss0 = rss()
conns = []; t0 = time.time()
for i in range(n):
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    s.sendall(frame({"v":1,"type":"HELLO","id":f"h{i}","ts":1,"payload":{"agent":f"a{i}","cli":"x"}}))
    while read_frame(s)["type"] != "WELCOME": pass
    conns.append(s)
print(f"{n} connected in {time.time()-t0:.1f} s ({n/(time.time()-t0):.0f}/s)", flush=True)
sel = selectors.DefaultSelector()
for c in conns: c.setblocking(False); sel.register(c, selectors.EVENT_READ)
bufs = {}
got = set()
def pump(timeout):
    for key, _ in sel.select(timeout):
        c = key.fileobj
        try: data = c.recv(262144)
        except BlockingIOError: continue
        b = bufs.get(c, b"") + data
        while len(b) >= 4:
            (l,) = struct.unpack(">I", b[:4])
            if len(b) < 4 + l: break
            f = json.loads(b[4:4+l]); b = b[4+l:]
            if f["type"] == "PING":
                try: c.send(frame({"v":1,"type":"PONG","id":"p","ts":1,"payload":f.get("payload") or {}}))
                except BlockingIOError: pass
            elif f["type"] == "DELIVER":
                got.add(c)
        bufs[c] = b
pump(0.5)
time.sleep(2)
pump(0.1)
rss1 = rss()
print(f"RSS {rss1/1024:.0f} MiB: {(rss1-rss0)/n:.1f} KiB per agent over the empty daemon ({rss0/1024:.0f} MiB)", flush=True)
# Idle CPU, PINGs answered.
c0 = cpu(); te = time.time() + idle
while time.time() < te: pump(0.2)
c1 = cpu()
print(f"idle: daemon {100*(c1-c0)/idle:.2f}% of a core over {idle:.0f} s", flush=True)
# One broadcast.
snd = socket.socket(socket.AF_UNIX); snd.connect(sock)
snd.sendall(frame({"v":1,"type":"HELLO","id":"hs","ts":1,"payload":{"agent":"sender","cli":"x"}}))
while read_frame(snd)["type"] != "WELCOME": pass
ts = time.time()
snd.sendall(frame({"v":1,"type":"SEND","id":"b1","ts":1,"to":"*","payload":{"body":"x"*200}}))
while len(got) < n and time.time() - ts < 120: pump(0.5)
print(f"broadcast to {n}: {len(got)} delivered in {time.time()-ts:.3f} s (SEND written to last DELIVER read by this one Python reader)", flush=True)
p.terminate(); p.wait()
import shutil
shutil.rmtree(d, ignore_errors=True)
