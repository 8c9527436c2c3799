"""The statistics of one rollout batch that every on-policy step logs (reward terms, accuracy,
lengths, turns, tool calls, finish reasons), gathered over processes (training/sampler.py)."""

from __future__ import annotations

from typing import Any

import torch

from agentic_rl.errors import RunStopped
from agentic_rl.rollout.trajectory import Trajectory
from agentic_rl.training.gather import gather_in_global_order, gather_objects


def rollout_statistics(
    trajs: list[Trajectory], global_rewards: torch.Tensor, rollout_seconds: float, accelerator: Any, cfg: Any
) -> dict[str, float]:
    """Rollout statistics over the whole batch: under DDP every rank gathers every episode's
    numbers, so each rank logs the same values as one process would. Warns when most episodes hit
    rollout.max_episode_tokens, prints each failed episode, and stops the run when all failed."""
    names = list(trajs[0].reward_components) if trajs else []
    stats = ["correct", "policy_tokens", "turns", "tool_calls", "tool_errors", "failed"]
    local = torch.tensor(
        [
            [t.reward_components[n] for n in names]
            + [
                float(bool(t.info.get("correct"))),
                float(t.num_policy_tokens),
                float(t.num_turns),
                float(t.info.get("tool_calls", 0)),
                float(t.info.get("tool_errors", 0)),
                float(t.finish_reason == "error"),
            ]
            for t in trajs
        ],
        dtype=torch.float64,
    ).reshape(len(trajs), len(names) + len(stats))  # (B_local, K)
    table = gather_in_global_order(accelerator, local)  # (B, K)
    column = {key: table[:, i] for i, key in enumerate([*names, *stats])}
    reasons = gather_objects(accelerator, [t.finish_reason for t in trajs])  # (B,)
    metrics: dict[str, float] = {
        "reward/total/mean": float(global_rewards.mean()),
        "reward/total/std": float(global_rewards.std()) if global_rewards.numel() > 1 else 0.0,
    }
    for name in names:
        metrics[f"reward/{name}/mean"] = float(column[name].mean())
        metrics[f"reward/{name}/std"] = float(column[name].std()) if column[name].numel() > 1 else 0.0
    episodes = max(1, table.shape[0])
    metrics.update(
        {
            "rollout/accuracy": float(column["correct"].sum()) / episodes,
            "rollout/completion_tokens/mean": float(column["policy_tokens"].sum()) / episodes,
            "rollout/completion_tokens/max": float(column["policy_tokens"].max()) if table.shape[0] else 0.0,
            "rollout/turns/mean": float(column["turns"].sum()) / episodes,
            "rollout/tool_calls/mean": float(column["tool_calls"].sum()) / episodes,
            "rollout/tool_errors/mean": float(column["tool_errors"].sum()) / episodes,
            "rollout/failed": float(column["failed"].sum()),
            # ranks decode at the same time: all of the batch's tokens over this rank's wall time
            "rollout/tokens_per_second": float(column["policy_tokens"].sum()) / max(rollout_seconds, 1e-9),
            "time/rollout": rollout_seconds,
        }
    )
    for reason in sorted(set(reasons)):
        metrics[f"rollout/finish/{reason}"] = reasons.count(reason) / len(reasons)
    cut = reasons.count("max_episode_tokens") / max(1, len(reasons))
    if cut >= 0.5:  # such an episode ends before it can succeed: the reward measures the limit
        accelerator.print(
            f"WARNING: {cut:.0%} of this batch's episodes ended at rollout.max_episode_tokens "
            f"({cfg.rollout.max_episode_tokens} tokens, prompt included) before they could finish; raise it "
            "(rollout/finish/max_episode_tokens in metrics.jsonl)",
            flush=True,
        )
    rank = f"[rank {accelerator.process_index}] " if accelerator.num_processes > 1 else ""
    for traj in trajs:  # every rank reports its own failed episodes
        if traj.finish_reason == "error":
            print(f"{rank}episode failed (task {traj.task_id}): {traj.info.get('error')}", flush=True)
    if table.shape[0] and float(column["failed"].sum()) == table.shape[0]:  # the same on every rank: all stop
        raise RunStopped(
            f"every episode of this batch failed ({table.shape[0]} of {table.shape[0]}, each printed above with its "
            "error): the env or its tools raise, so there is nothing to learn from. Check the env with "
            f"`agentic-rl envs oracle {cfg.env.name}` and `agentic-rl eval`, which show the error of each failure"
        )
    return metrics
