"""An evaluation file with every failure's transcript, and its tasks rebuilt: what the failure
scripts (plan_failures.py, memory_failures.py) read. Imported by them from this folder."""

from __future__ import annotations

import collections
import json
from typing import Any

from agentic_rl.envs.base import Env, Task


def load_failures(path: str, env_name: str, env: Env) -> tuple[dict[str, Any], dict[str, Task]]:
    """The evaluation at `path` and its tasks by id, rebuilt by `env` (built with the evaluation's
    options) from ids of the form name/split/seed/index. Stops, naming the file, unless it is an
    evaluation of `env_name` that kept every failure's transcript (`--set failures_shown=100`)."""
    run = json.load(open(path))
    failed = len(run["per_task"]["id"]) - sum(run["per_task"]["greedy"])
    if run["env"] != env_name or len(run["failures"]) < failed:
        raise SystemExit(
            f"{path}: {len(run['failures'])} transcripts kept of {failed} failures (env {run['env']}); "
            f"evaluate {env_name} again with --set failures_shown=100"
        )
    sets = collections.defaultdict(int)  # (split, seed) -> tasks it needs
    for task_id in run["per_task"]["id"]:
        split, seed, index = task_id.split("/")[1:]
        sets[split, int(seed)] = max(sets[split, int(seed)], int(index) + 1)
    return run, {t.id: t for (split, seed), n in sets.items() for t in env.tasks(split, n=n, seed=seed)}
