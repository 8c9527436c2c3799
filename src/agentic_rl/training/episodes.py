"""A step's episodes as training rows: `Collected` (what the sampler hands an algorithm), and the
row arithmetic GRPO and PPO share: the composed reward placed on the turns, each row's share of its
episode's tokens, and the padding micro-batches DDP needs.

Episodes whose history is not a prefix (an env that changes the context, e.g. memory's window)
hold several token sequences (Trajectory.previous). Rewards, groups and advantages are per
episode, as always; only after them is each episode expanded into one training row per sequence,
each with its own mask and log-probs and its episode's advantage (or its turns' share of the
per-turn values). The stride split over processes (training/sampler.py) stays over episodes, so a
rank may hold more rows than another:

    episodes      e0 (1 sequence)   e1 (3 sequences)   e2 (1)      local rows: 5
    rows          r0                r1 r2 r3           r4          row_episode [0, 1, 1, 1, 2]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from agentic_rl.rewards.base import RewardSpec
from agentic_rl.rollout.trajectory import Trajectory, TrajectoryBatch
from agentic_rl.training.groups import Group


@dataclasses.dataclass
class Collected:
    """One step's episodes, scored and collated: what an objective builds its batch from."""

    groups: list[Group]
    trajectories: list[Trajectory]
    """This process's episodes, in global row order."""
    rewards: torch.Tensor
    """(B,) composed rewards of every episode of every process, in global row order."""
    local_rows: list[int]
    """The global row of each local episode."""
    tensors: TrajectoryBatch
    """Collated (R_local, T) tensors, one row per token sequence (module docstring; R_local = B_local
    when every episode is one sequence); failed episodes have an all-zero loss mask (never trained)."""
    metrics: dict[str, float]
    sequences: list[Trajectory] = dataclasses.field(default_factory=list)
    """The (R_local,) token sequences the tensors hold, in episode order (Trajectory.sequences())."""
    row_episode: list[int] = dataclasses.field(default_factory=list)
    """(R_local,) the local episode (index into `trajectories`) of each row."""

    def rows_of(self, per_episode: list) -> list:
        """A per-episode list spread over the rows: each row gets its episode's entry."""
        return [per_episode[episode] for episode in self.row_episode]

    def turns_by_row(self, per_episode_turns: list[list[float]]) -> list[list[float]]:
        """Per-episode per-turn values (one per policy turn of the episode) split over its rows:
        each row gets the values of the turns that sequence holds."""
        out = []
        for episode, values in enumerate(per_episode_turns):
            start = 0
            for seq in self.trajectories[episode].sequences():
                count = len(seq.policy_spans)
                out.append(list(values[start : start + count]) if values else [])
                start += count
            assert not values or start == len(values), f"episode {episode}: {len(values)} turn values for {start} turns"
        return out


def rewards_per_turn(trajs: list[Trajectory], totals: list[float], specs: list[RewardSpec]) -> list[list[float]]:
    """Each episode's composed reward, placed on its policy turns (GRPO's turn mode and PPO).

    The sum over an episode's turns is exactly its composed reward `totals[i]`: the placement
    moves reward, it never adds any. The `env_steps` term's share, w·γ_s^k·r_k for the env's
    reward r_k of turn k, sits on turn k; everything else (accuracy, format, a reward model, ...)
    sits on the last turn. Without an `env_steps` term the env's per-step rewards are not used at
    all, as in episode mode (arith's last step reward repeats its correctness, which the accuracy
    term already pays). An episode without a turn gets one, holding its reward.
    """
    env_terms = [(spec.weight, float(spec.params.get("gamma", 1.0))) for spec in specs if spec.name == "env_steps"]
    out = []
    for traj, total in zip(trajs, totals):
        placed = [
            sum(weight * gamma**k for weight, gamma in env_terms) * reward for k, reward in enumerate(traj.turn_rewards)
        ]
        placed = placed or [0.0]
        placed[-1] += total - sum(placed)
        out.append(placed)
    return out


def episode_token_shares(loss_mask: torch.Tensor, row_episode: list[int]) -> torch.Tensor:
    """(R,) each row's share of its episode's policy tokens: 1 for an episode of one row, and the
    shares of an episode's rows sum to 1 (0 for rows of an episode with no trained token).

    loss_type grpo averages each episode's loss over its policy tokens, then over episodes; an
    episode of several rows (sequences) is one episode, so each row's per-row mean is weighted by
    its token share: Σ_r share_r · mean_r = (Σ_r Σ_t l_rt) / (the episode's tokens)."""
    tokens = loss_mask.sum(-1).double()  # (R,)
    episode = torch.tensor(row_episode, dtype=torch.long)  # (R,)
    per_episode = torch.zeros(int(episode.max()) + 1 if len(row_episode) else 0, dtype=torch.float64).index_add_(
        0, episode, tokens
    )
    return (tokens / per_episode[episode].clamp(min=1.0)).float()  # (R,)


def pad_micro_batches(micros: list, accelerator: Any, make_dummy) -> list:
    """Append dummy micro-batches until every process has as many as the one with the most: DDP
    all-reduces in the last backward of each rank, so all ranks must run the same number of them.
    Ranks can differ when episodes hold different numbers of token sequences."""
    if accelerator.num_processes == 1:
        return micros
    count = torch.tensor([len(micros)], device=accelerator.device)
    most = int(accelerator.gather(count).max().cpu())
    return micros + [make_dummy() for _ in range(most - len(micros))]
