"""Does a refactor move a number? Tiny GRPO, PPO and SFT runs (tiny-qwen3, fp32, 3-4 steps) over
the trainer's levers, on the code under PYTHONPATH: every logged metric except timings, and a
digest of the final weights, to OUT/result.json. Run it on two versions, then compare:

    PYTHONPATH=<old worktree>/src python experiments/same_numbers.py runs/same/before
    PYTHONPATH=<new worktree>/src python experiments/same_numbers.py runs/same/after
    python experiments/same_numbers.py --compare runs/same/before runs/same/after

Issue 34 (the training layer rewritten, 2026-12-04): all ten configurations bit for bit equal.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from agentic_rl.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import helpers_training  # noqa: E402,F401  (registers the token_parity reward and the ragged_arith env the runs use)


TINY = [
    "model.name=tiny-qwen3",
    "model.lora.r=4",
    "optim.lr=1e-2",
    "rollout.batch_size=4",
    "rollout.group_size=2",
    "rollout.max_turn_tokens=8",
    "rollout.max_turns=1",
    "rollout.max_episode_tokens=1024",
    "env.options={difficulty: 1}",
    "env.task_pool=8",
    "rewards=[{name: token_parity}, {name: format, weight: 0.5}]",
    "micro_batch_size=4",
    "train.progress=false",
    "train.steps=3",
]
RUNS = {
    "grpo": ("grpo", []),
    "grpo_mu2": ("grpo", ["updates_per_batch=2", "old_logprobs=recompute", "train.steps=4"]),
    "grpo_beta_dyn": (
        "grpo",
        ["loss.beta=0.04", "selection.dynamic_sampling=true", "rollout.batch_size=8", "micro_batch_size=3"],
    ),
    "grpo_gspo": ("grpo", ["loss.importance_sampling_level=sequence", "loss.loss_type=grpo"]),
    "grpo_turn": (
        "grpo",
        [
            "env.name=ragged_arith",
            "env.options={}",
            "rollout.max_turns=2",
            "advantage.mode=turn_position",
            "rewards=[{name: token_parity}, {name: env_steps, weight: 1.0}]",
            "loss.loss_type=dapo",
        ],
    ),
    "grpo_tis": ("grpo", ["rollout_correction.mode=tis", "old_logprobs=recompute", "loss.entropy_coef=0.01"]),
    "grpo_memory": (
        "grpo",
        [
            "env.name=memory",
            "rollout.max_turns=6",
            "env.options={}",
            "rewards=[{name: token_parity}]",
            "micro_batch_size=3",
        ],
    ),
    "ppo": ("ppo", []),
    "ppo_mu2_beta": ("ppo", ["updates_per_batch=2", "old_logprobs=recompute", "loss.beta=0.05", "train.steps=4"]),
    "sft": ("sft", None),
}
"""name -> (command, overrides on TINY): the levers the training layer implements."""


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def compare(before: Path, after: Path) -> int:
    """Print, per configuration, whether the final weights and every logged metric are equal; 1 if any differs."""
    a, b = (json.loads((root / "result.json").read_text()) for root in (before, after))
    moved = 0
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name, {"error": "missing"}), b.get(name, {"error": "missing"})
        if "error" in x or "error" in y:
            print(f"{name}: {x.get('error', 'ran')} / {y.get('error', 'ran')}")
            moved = 1
            continue
        diffs = [
            (step, key)
            for step, (p, q) in enumerate(zip(x["history"], y["history"]))
            for key in sorted(set(p) | set(q))
            if p.get(key) != q.get(key) and not (p.get(key) != p.get(key) and q.get(key) != q.get(key))
        ]
        same = x["final"] == y["final"] and not diffs and len(x["history"]) == len(y["history"])
        moved |= not same
        print(
            f"{name}: weights {'equal' if x['final'] == y['final'] else 'DIFFER'}, {len(x['history'])} steps, "
            f"{len(x['history'][0])} metrics, {len(diffs)} differences {diffs[:3]}"
        )
    return moved


if sys.argv[1] == "--compare":
    sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
out_root = Path(sys.argv[1])
names = sys.argv[2:] or list(RUNS)
result = {}
for name in names:
    kind, extra = RUNS[name]
    started = time.time()
    out = out_root / name
    try:
        if kind == "grpo":
            from agentic_rl.training.grpo_config import GRPOConfig
            from agentic_rl.training.grpo import train_grpo

            r = train_grpo(
                load_config(
                    GRPOConfig, None, overrides=[*TINY, *extra, f"train.output_dir={out}", "train.resume=false"]
                )
            )
        elif kind == "ppo":
            from agentic_rl.training.ppo_config import PPOConfig
            from agentic_rl.training.ppo import train_ppo

            tiny = [o for o in TINY if not o.startswith(("rollout.group_size", "rewards="))] + [
                "rewards=[{name: token_parity}]"
            ]
            r = train_ppo(
                load_config(PPOConfig, None, overrides=[*tiny, *extra, f"train.output_dir={out}", "train.resume=false"])
            )
        else:
            from agentic_rl.training.sft import SFTConfig, train_sft

            r = train_sft(
                load_config(
                    SFTConfig,
                    None,
                    overrides=[
                        "model.name=tiny-qwen3",
                        "model.lora.r=4",
                        "train.steps=3",
                        "train.progress=false",
                        f"train.output_dir={out}",
                        "train.resume=false",
                        "sources=[{env: {name: arith}, n: 16}]",
                        "batch_size=4",
                    ],
                )
            )
        hist = [
            {k: v for k, v in row.items() if not k.startswith("time/") and "per_second" not in k}
            for row in r["history"]
        ]
        result[name] = {"history": hist, "final": digest(Path(r["final"]))}
    except Exception as exc:  # record and go on
        result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(
        name, f"{time.time() - started:.0f}s", result[name].get("error", result[name].get("final", "")[:12]), flush=True
    )
(out_root / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
