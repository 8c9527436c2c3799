"""What the per-call memory cgroup costs a `python` tool call: the same calls with and without it.

    .venv/bin/python benchmarks/sandbox_cgroup_cost.py [--calls 30]

Runs `print(1)` through `run_python` `--calls` times with each call's cgroup made and removed
(sandbox_memory.py), then as many times with cgroups switched off for this process (the per-process
caps only), interleaved in blocks of 5 so drift hits both alike. Prints the median and range of
each, and the ratio of the medians. Where no cgroup can be made here it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from agentic_rl.tools import sandbox_memory, sandbox_supervisor
from agentic_rl.tools.sandbox_limits import SandboxLimits


def _timed_call() -> float:
    start = time.perf_counter()
    result = sandbox_supervisor.run_python("print(1)", SandboxLimits(timeout_s=30.0))
    assert result.ok and result.stdout == "1\n", result
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    if not sandbox_memory.cgroups_available():
        raise SystemExit("no memory cgroup can be made here: nothing to compare")
    times: dict[str, list[float]] = {"with cgroup": [], "without": []}
    _timed_call()  # warm-up: the interpreter's files in the page cache
    for block in range(0, args.calls, 5):
        for label, capped in (("with cgroup", True), ("without", False)):
            sandbox_supervisor.cgroups_available = (lambda: True) if capped else (lambda: False)
            times[label] += [_timed_call() for _ in range(min(5, args.calls - block))]
    rows = {
        label: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "max_ms": max(t) * 1e3}
        for label, t in times.items()
    }
    for label, row in rows.items():
        print(
            f"{label:<12} median {row['median_ms']:.1f} ms [{row['min_ms']:.1f}, {row['max_ms']:.1f}] over {args.calls} calls"
        )
    ratio = rows["with cgroup"]["median_ms"] / rows["without"]["median_ms"]
    print(f"ratio with/without: {ratio:.3f}")
    print(json.dumps({"calls": args.calls, **rows, "ratio": ratio}))


if __name__ == "__main__":
    main()
