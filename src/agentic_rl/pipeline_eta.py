"""How long the pipeline's remaining stages will take, from what its finished stages measured.

    [pipeline] sft: done in 5 min 40 s (elapsed 5 min 52 s); about 14 min left (eval_sft ~2 min, grpo ~9 min, eval_grpo ~2 min)

Nothing here is a benchmark: each estimate scales a measured stage of this run by the work the
next one does, so it needs the stage it scales from.

- an evaluation decodes its episodes (n, plus n x k samples where k > 1, over the `evals` that run on
  its model) at the last evaluation's seconds per episode;
- SFT and the control take steps x the SFT stage's measured seconds per step, plus the SFT
  stage's time outside its steps (model loading, saving);
- an RL step decodes its episodes at the last evaluation's seconds per episode (rollouts sample
  where evaluation decodes greedily, at a similar length), times 1.5 with dynamic sampling (its
  replacement round redraws about half the groups on the demo: EXPERIMENTS.md), and trains them
  at the SFT stage's seconds per demonstration, once per update, on the share of the batch an update
  trains (GRPO leaves out the groups whose rewards are all equal: skip_zero_advantage). `train.steps` counts updates, so
  with μ = updates_per_batch there are steps / μ rollout batches; PPO's also take one value pass
  each (a forward, ~1/3 of a forward and backward). GRPO has no such pass: its π_old comes from
  the first update's forward (old_logprobs: recompute) or the sampler.

Before the SFT stage and an evaluation have run there is nothing to scale; those stages, and the
reward-model stage (whose pair sampling and scoring scale with neither), are named as not estimable. The RL stage's own progress bar gives its time left once it runs.
"""

from __future__ import annotations

import math
from typing import Any

DYNAMIC_SAMPLING_FACTOR = 1.5
"""Rollout work with selection.dynamic_sampling, relative to one round (see the module docstring)."""
TRAINED_SHARE = 0.65
"""Share of a GRPO rollout batch that an update trains when skip_zero_advantage leaves out the groups
whose G rewards are all equal: 20.3 of 32 episodes a step in the demo's GRPO stage (2026-12-04,
`train/episodes_trained`). Without it the demo's GRPO estimate was 34 min against 20 min measured."""


def trained_share(section: Any) -> float:
    """TRAINED_SHARE where the RL section skips zero-advantage episodes as GRPO's step does
    (skip_zero_advantage, on a loss where such rows are inert), else 1 (PPO trains every episode)."""
    skips = getattr(section, "skip_zero_advantage", False) and section.loss.zero_advantage_rows_are_inert
    return TRAINED_SHARE if skips else 1.0


def estimate_seconds(cfg: Any, stage: str, done: dict[str, dict[str, Any]]) -> float | None:
    """Estimated wall seconds of `stage` from the finished stages' results (`done`), or None."""
    evals = [result for name, result in done.items() if name.startswith("eval_") and "seconds" in result]
    sft = done.get("sft")
    sft_step = sft["train_seconds"] / max(1, sft["steps"]) if sft and sft.get("train_seconds") else None
    overhead = max(0.0, sft["seconds"] - sft["train_seconds"]) if sft_step else 0.0
    if stage.startswith("eval_"):
        if not evals:
            return None
        last = evals[-1]
        return (
            last["seconds"]
            / max(1, _episodes(last["evals"].values()))
            * _episodes(vars(e) for e in cfg.evals_for(stage.removeprefix("eval_")))
        )
    if stage == "control":
        if sft_step is None:
            return None
        if cfg.control.steps:
            return cfg.control.steps * sft_step + overhead
        rl = done.get(cfg.rl.algorithm)
        return rl["train_seconds"] + overhead if rl else None
    if stage in ("grpo", "ppo"):
        if sft_step is None or not evals:
            return None
        section = getattr(cfg, stage)
        last = evals[-1]
        per_episode = last["seconds"] / max(1, _episodes(last["evals"].values()))
        rollout = (
            section.rollout.batch_size
            * per_episode
            * (DYNAMIC_SAMPLING_FACTOR if section.selection.dynamic_sampling else 1.0)
        )
        update = section.rollout.batch_size * sft_step / cfg.sft.batch_size  # one forward/backward over the batch
        value_pass = (
            update / 3 if stage == "ppo" else 0.0
        )  # PPO's value pass, a forward alone: ~1/3 of forward+backward
        rollout_batches = math.ceil(section.train.steps / section.updates_per_batch)  # train.steps counts updates
        return (
            rollout_batches * (rollout + value_pass) + section.train.steps * update * trained_share(section) + overhead
        )
    return None


def _episodes(evals: Any) -> int:
    """Episodes decoded by evaluations (each a result or a config, as a dict with n and k): the greedy
    pass@1 episode of each problem, and its k samples where k > 1."""
    return sum(e["n"] * (1 + (e["k"] if e.get("k", 1) > 1 else 0)) for e in evals)


def minutes(seconds: float) -> str:
    """'2 min 05 s' (or '45 s')."""
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def progress_line(
    cfg: Any, stage: str, seconds: float, elapsed: float, done: dict[str, dict[str, Any]], remaining: list[str]
) -> str:
    """The line printed after each stage: its time, the time so far and the estimated time left."""
    line = f"[pipeline] {stage}: done in {minutes(seconds)} (elapsed {minutes(elapsed)})"
    if not remaining:
        return line
    estimates = {name: estimate_seconds(cfg, name, done) for name in remaining}
    known = {name: value for name, value in estimates.items() if value is not None}
    parts = [
        f"{name} ~{minutes(value)}" if value is not None else f"{name} not estimable yet"
        for name, value in estimates.items()
    ]
    if not known:  # "at least 0 s left" would read as "done"
        return line + f"; time left not estimable yet ({', '.join(parts)})"
    total = sum(known.values())
    prefix = "about" if len(known) == len(estimates) else "at least"
    return line + f"; {prefix} {minutes(total)} left ({', '.join(parts)})"
