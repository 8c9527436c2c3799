"""Worker for tests/test_distributed.py: a tiny GRPO run under torchrun that records, per rank,
what each rank rolled out and trained on.

    torchrun --nproc_per_node 2 tests/ddp_worker.py OUT_DIR

Writes OUT_DIR/rank<k>.json: per step, the global rows this rank rolled out, their rewards,
the gathered global rewards, the advantages it trained with, and a digest of its trainable
parameters after the optimizer step.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import helpers_training as shared  # noqa: E402  (registers the test reward)
from agentic_rl.training.grpo import GRPO, train_grpo  # noqa: E402


def main(out: Path) -> None:
    records: list[dict] = []
    original_advantages, original_step = GRPO.advantages, GRPO.step

    def advantages(self, collected):
        result = original_advantages(self, collected)  # (R_local, T): episode mode, one value per row
        trajs = collected.trajectories
        records.append(
            {
                "rows": list(collected.local_rows),
                "task_ids": [t.task_id for t in trajs],
                "local_rewards": [t.reward for t in trajs],
                "global_rewards": collected.rewards.tolist(),
                "advantages": result[:, 0].tolist(),
            }
        )
        return result

    def step(self, trainer, index):  # μ = 1: one rollout batch (one `advantages` record) per step
        metrics = original_step(self, trainer, index)
        batch, step = self.batch, len(records) - 1
        params = [p.detach().double() for p in self.sampler.policy.parameters() if p.requires_grad]
        digest = hashlib.sha256(b"".join(p.cpu().numpy().tobytes() for p in params)).hexdigest()
        logged = {
            k: v for k, v in metrics.items() if k.startswith(("reward/", "rollout/")) and "tokens_per_second" not in k
        }
        records[-1].update(
            {
                "step": step,
                "param_digest": digest,
                "metrics": logged,
                "policy_tokens": [len([m for m in t.loss_mask if m]) for t in batch.trajectories],
                "param_abs_sum": float(sum(p.abs().sum() for p in params)),
                "rank": self.accelerator.process_index,
                "world": self.accelerator.num_processes,
            }
        )
        return metrics

    GRPO.advantages, GRPO.step = advantages, step
    cfg = shared.grpo_cfg(
        out / "run",
        "train.steps=2",
        "loss.beta=0",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_turn_tokens=6",
        "train.resume=false",
    )
    train_grpo(cfg)
    rank = records[0]["rank"]
    (out / f"rank{rank}.json").write_text(json.dumps(records))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
