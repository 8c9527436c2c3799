"""A trained Bradley-Terry reward model as a reward term (`reward_model: {path, weight}` in GRPO).

Scores each trajectory's exact token ids (no re-tokenization) with the reward model's score at
the last real token, batched. The value is the raw score r(x, y); its weight sets the scale.
An episode of several token sequences (an env that drops old turns, Trajectory.previous) is
scored on its last sequence: the context the policy gave its answer from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from agentic_rl.models.reward_scorer import load_trained_reward_model
from agentic_rl.rollout.trajectory import Trajectory, collate


class RewardModelReward:
    """Callable reward term: trajectories -> list of reward-model scores."""

    def __init__(self, path: str | Path, batch_size: int = 8, device: str = "cpu"):
        self.scorer, self.tokenizer = load_trained_reward_model(path, device)
        self.batch_size, self.device = batch_size, device

    @torch.no_grad()
    def __call__(self, trajectories: Sequence[Trajectory]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(trajectories), self.batch_size):
            tensors = collate(trajectories[start : start + self.batch_size], self.tokenizer.pad_token_id).to(
                self.device
            )
            scores.extend(self.scorer(tensors.input_ids, tensors.attention_mask).tolist())
        return scores
