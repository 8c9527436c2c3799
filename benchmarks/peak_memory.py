"""python benchmarks/peak_memory.py CMD...: run CMD; print the peak RSS summed over it and all its descendants (a fork server's children included, which `time -v` misses), sampled every 0.2 s."""

import subprocess
import sys
import time


def tree_rss(root):
    rows = [
        l.split()
        for l in subprocess.run(["ps", "-eo", "pid=,ppid=,rss="], capture_output=True, text=True).stdout.splitlines()
    ]
    kids = {}
    rss = {}
    for pid, ppid, r in rows:
        kids.setdefault(int(ppid), []).append(int(pid))
        rss[int(pid)] = int(r)
    total, stack = 0, [root]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        stack += kids.get(p, [])
    return total


proc = subprocess.Popen(sys.argv[1:])
peak = 0
while proc.poll() is None:
    peak = max(peak, tree_rss(proc.pid))
    time.sleep(0.2)
print(f"peak tree RSS {peak / 1024 / 1024:.2f} GiB", file=sys.stderr)
sys.exit(proc.returncode)
