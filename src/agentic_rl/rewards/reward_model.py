"""A trained Bradley-Terry reward model as a reward term (`reward_model: {path, weight}` in GRPO).

Scores each trajectory's exact token ids (no re-tokenization) with the reward model's score at
the last real token, batched. The value is the raw score r(x, y); its weight sets the scale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch

from agentic_rl.rollout.trajectory import Trajectory, collate


class RewardModelReward:
    """Callable reward term: trajectories -> list of reward-model scores."""

    def __init__(self, path: str | Path, batch_size: int = 8, device: str = "cpu"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from agentic_rl.training.reward_model import RewardScorer

        path = Path(path)
        record = path / "agentic_rl_rm.json"
        if not record.exists():
            raise ValueError(f"{path} is not a reward model from `agentic-rl rm` (no agentic_rl_rm.json)")
        meta = json.loads(record.read_text())
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if meta.get("lora"):
            from peft import AutoPeftModelForSequenceClassification

            classifier = AutoPeftModelForSequenceClassification.from_pretrained(path, num_labels=1).merge_and_unload()
        else:
            classifier = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        self.scorer = RewardScorer(classifier.eval().to(device))
        self.batch_size, self.device = batch_size, device

    @torch.no_grad()
    def __call__(self, trajectories: Sequence[Trajectory]) -> list[float]:
        scores: list[float] = []
        for start in range(0, len(trajectories), self.batch_size):
            tensors = collate(trajectories[start : start + self.batch_size], self.tokenizer.pad_token_id).to(self.device)
            scores.extend(self.scorer(tensors.input_ids, tensors.attention_mask).tolist())
        return scores
