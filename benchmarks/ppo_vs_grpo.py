"""The cost side of the seed's PPO-vs-GRPO table, measured: seconds per step, peak memory and the
parameters each trainer holds, GRPO against PPO with a shared or a separate value model.

    .venv/bin/python benchmarks/ppo_vs_grpo.py [--model runs/x2/sft/final] [--steps 2] [--rounds 2]

Every variant trains from the same SFT adapters with the settings of the accuracy runs (EXPERIMENTS.md): configs/experiments/demo-grpo.yaml and demo-ppo.yaml, 32 episodes per step of
two-step `arith` problems on the new story templates, bf16 rollouts and autocast, 2 CPU cores.
  grpo          8 prompts × G = 8, dynamic sampling (up to one extra rollout round), β = 0
  ppo-shared    32 prompts × 1, a value head on the policy's LoRA trunk
  ppo-separate  32 prompts × 1, a second SmolLM2 with its own adapters and head as the critic

Each (round, variant) runs in a fresh child process (so its peak RSS is its own) for `steps`
optimizer steps; the variants alternate within a round (A B C A B C), so machine load drifts
over all of them alike. Reported per variant: the median, min and max over all measured steps of
the step time (rollout + scoring + forward/backward + optimizer, from metrics.jsonl) and of its
rollout part, the peak RSS of the child (GiB), and the parameters held (policy with adapters,
value head or critic, reference copy if any). The step time depends on what the policy
generates (longer episodes cost more), so the rollout and training parts are shown apart.

The last line printed is JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = {
    "grpo": ("grpo", "configs/experiments/demo-grpo.yaml", []),
    "ppo-shared": ("ppo", "configs/experiments/demo-ppo.yaml", ["value.critic=shared"]),
    "ppo-separate": ("ppo", "configs/experiments/demo-ppo.yaml", ["value.critic=separate"]),
}


def child(variant: str, model: str, steps: int, seed: int, out: str) -> dict:
    """Train `steps` steps of one variant in this process; return its figures."""
    from agentic_rl.config import load_config

    trainer, config, extra = VARIANTS[variant]
    held: dict[str, int] = {}
    if trainer == "grpo":
        import agentic_rl.training.grpo as module
        from agentic_rl.training.grpo_config import GRPOConfig as Config

        run = module.train_grpo
    else:
        import agentic_rl.training.ppo as module
        from agentic_rl.training.ppo_config import PPOConfig as Config

        run = module.train_ppo
    import agentic_rl.training.loop as loop_module  # train_on_policy imports run_training from here when it runs

    original = loop_module.run_training

    def counting(objective, scorer, *args, **kwargs):
        held["parameters"] = sum(p.numel() for p in scorer.parameters())
        held["trainable"] = sum(p.numel() for p in scorer.parameters() if p.requires_grad)
        if objective.reference is not None:
            held["parameters"] += sum(p.numel() for p in objective.reference.parameters())
        return original(objective, scorer, *args, **kwargs)

    loop_module.run_training = counting
    cfg = load_config(
        Config,
        REPO / config,
        overrides=[
            f"model.name={model}",
            f"train.steps={steps}",
            f"train.seed={seed}",
            f"train.output_dir={out}",
            "train.progress=false",
            *extra,
        ],
    )
    history = run(cfg)["history"]
    step_seconds = [row["time/data"] + row["time/forward_backward"] + row["time/optimizer"] for row in history]
    return {
        "step_seconds": step_seconds,
        "rollout_seconds": [row["time/rollout"] for row in history],
        "episodes_rolled_out": [32 * row.get("rollout/rounds", 1.0) if trainer == "grpo" else 32 for row in history],
        "policy_tokens": [row["rollout/completion_tokens/mean"] for row in history],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        **held,
    }


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/x2/sft/final", help="the SFT adapters every variant starts from")
    parser.add_argument("--steps", type=int, default=2, help="measured optimizer steps per child")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all variants, alternating")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, seed, out = args.child
        print("RESULT " + json.dumps(child(variant, args.model, args.steps, int(seed), out)), flush=True)
        return
    if not Path(args.model).exists():
        raise SystemExit(
            f"--model {args.model} does not exist; make it with "
            "`agentic-rl pipeline --config configs/demo.yaml --set output_dir=runs/x2` (its sft/final)"
        )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    runs: dict[str, list[dict]] = {variant: [] for variant in args.variants}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for variant in args.variants:
                out = Path(scratch) / f"{variant}-{round_index}"
                command = [
                    sys.executable,
                    __file__,
                    "--model",
                    args.model,
                    "--steps",
                    str(args.steps),
                    "--child",
                    variant,
                    str(round_index),
                    str(out),
                ]
                proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                if proc.returncode != 0 or not lines:
                    raise SystemExit(f"{variant} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
                runs[variant].append(json.loads(lines[-1][len("RESULT ") :]))
                print(
                    f"round {round_index + 1} {variant}: steps {[round(s, 1) for s in runs[variant][-1]['step_seconds']]} s, "
                    f"peak RSS {runs[variant][-1]['peak_rss_gb']:.2f} GiB",
                    flush=True,
                )
    result = {}
    for variant, children in runs.items():
        steps = [s for c in children for s in c["step_seconds"]]
        rollouts = [s for c in children for s in c["rollout_seconds"]]
        result[variant] = {
            "step_seconds": _summary(steps),
            "rollout_seconds": _summary(rollouts),
            "train_seconds": _summary([a - b for a, b in zip(steps, rollouts)]),
            "episodes_rolled_out": _summary([e for c in children for e in c["episodes_rolled_out"]]),
            "policy_tokens_per_episode": _summary([t for c in children for t in c["policy_tokens"]]),
            "peak_rss_gb": _summary([c["peak_rss_gb"] for c in children]),
            "parameters_held": children[0]["parameters"],
            "trainable_parameters": children[0]["trainable"],
        }
    print()
    print(
        f"{'variant':<14}{'step s (median [min, max])':<30}{'rollout s':<12}{'train s':<10}{'peak RSS GiB':<14}{'params held':<14}trainable"
    )
    for variant, r in result.items():
        s = r["step_seconds"]
        print(
            f"{variant:<14}{s['median']:>6.1f} [{s['min']:.1f}, {s['max']:.1f}]{'':<12}{r['rollout_seconds']['median']:>8.1f}    "
            f"{r['train_seconds']['median']:>6.1f}    {r['peak_rss_gb']['median']:>8.2f}      {r['parameters_held']:>12,}  {r['trainable_parameters']:,}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
