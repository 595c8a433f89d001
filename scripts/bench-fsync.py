#!/usr/bin/env python3
# Usage: scripts/bench-fsync.py [DIR] [N]
# What one durable commit costs the disk alone: N times (default 2,000), append 4 KiB to a file in
# DIR (default: a temporary directory) and fdatasync it, one per millisecond (the light-load
# benchmark's rate), and print the fdatasync's p50/p90/p99/max. A SEND's DELIVER waits for this
# with `full` durability, so no SEND → DELIVER percentile can be below it (docs/PERFORMANCE.md).
import os, sys, tempfile, time

d = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="fsync")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
path = os.path.join(d, "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
ts = []
try:
    for _ in range(n):
        os.write(fd, b"x" * 4096)
        t = time.perf_counter()
        os.fdatasync(fd)
        ts.append(time.perf_counter() - t)
        time.sleep(0.001)
finally:
    os.close(fd)
    os.unlink(path)
ts.sort()
q = lambda f: ts[min(len(ts) - 1, int(len(ts) * f))] * 1e3
print(f"fdatasync of a 4 KiB append, {n} times, one per ms, in {d}: "
      f"p50 {q(0.5):.3f} ms, p90 {q(0.9):.3f}, p99 {q(0.99):.3f}, max {ts[-1] * 1e3:.3f}")
