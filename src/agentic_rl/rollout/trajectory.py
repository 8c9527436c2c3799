"""`Trajectory`: the one record of an episode that SFT, the reward model, RL and evaluation share.

Token-in-token-out (docs/design.md invariant 1): `input_ids` are exactly the ids the policy
sampled plus the ids the chat format rendered for the prompt and observations. Nothing here
is ever decoded and re-tokenized for training; `messages` exists for rewards, logs and
reports only.

Layout of one two-turn episode (P prompt, A policy, O observation):

    ids        P P P P A A A A O O O O A A A
    loss_mask  0 0 0 0 1 1 1 1 0 0 0 0 1 1 1      (1 also on the token that ends each turn)
    spans      [prompt 0:4][policy 4:8][observation 8:12][policy 12:15]

Episodes whose history is not a prefix (an env that drops old turns from what the policy sees,
`StepResult.context`) have several token sequences, each token-exact on its own:

    sequence 0   P P A A O O A A           the policy saw this context ...
    sequence 1   P' P' P' A A O O A A      ... then a re-rendered one (P': the env's context)

The episode's Trajectory holds its LAST sequence in the token fields and the earlier ones, oldest
first, in `previous` (each a Trajectory with its own ids, mask, log-probs, spans and turn
rewards). Episode facts (reward, reward_components, info, finish_reason, messages: the whole
conversation) live on the episode's Trajectory only, and its `turn_rewards` hold every turn of
the episode, in order. `sequences()` lists them all; a trainer trains each as its own row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Sequence

import torch

SpanKind = Literal["prompt", "policy", "observation"]


@dataclasses.dataclass
class Span:
    """A half-open token range [start, end) of one kind."""

    kind: SpanKind
    start: int
    end: int


@dataclasses.dataclass
class Trajectory:
    """One episode, token-exact. See the module docstring for the layout."""

    input_ids: list[int]
    """Every token of the episode: prompt, policy turns and observations, in order."""
    loss_mask: list[int]
    """1 on policy-generated tokens (including each turn's stop token), 0 elsewhere."""
    logprobs: list[float]
    """Sampling log-probability of each token under the sampling distribution; 0.0 where mask is 0."""
    spans: list[Span]
    """Consecutive spans covering `input_ids` exactly."""
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    """Reward the environment gave after each policy turn (one per policy span)."""
    weights_version: int = 0
    """Version counter of the weights that sampled this episode (invariant 3)."""
    env: str = ""
    task_id: str = ""
    finish_reason: str = ""
    """Why the episode ended: answered, max_turns, max_episode_tokens, max_turn_tokens, env_done, error."""
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The conversation as chat messages, for logs, reports and reward functions only."""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Episode info from the environment: correct, final_answer, tool_calls, tool_errors, ..."""
    reward: float | None = None
    """Total scalar reward, set by the reward composer."""
    reward_components: dict[str, float] = dataclasses.field(default_factory=dict)
    """Each named reward term's (unweighted) value, set by the reward composer."""
    previous: list["Trajectory"] = dataclasses.field(default_factory=list)
    """Earlier token sequences of a non-prefix episode, oldest first (module docstring); [] for
    an episode that is one sequence. Each holds its own turns' rewards; `messages` of each is the
    conversation that sequence rendered (its context, then its turns and observations)."""

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        assert len(self.loss_mask) == n, f"loss_mask has {len(self.loss_mask)} entries for {n} ids"
        assert len(self.logprobs) == n, f"logprobs has {len(self.logprobs)} entries for {n} ids"

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def policy_spans(self) -> list[Span]:
        return [s for s in self.spans if s.kind == "policy"]

    @property
    def prompt_length(self) -> int:
        return self.spans[0].end if self.spans and self.spans[0].kind == "prompt" else 0

    @property
    def num_policy_tokens(self) -> int:
        """Policy tokens of the whole episode (every sequence)."""
        return int(sum(self.loss_mask)) + sum(seq.num_policy_tokens for seq in self.previous)

    @property
    def num_turns(self) -> int:
        """Policy turns of the whole episode (every sequence)."""
        return len(self.policy_spans) + sum(seq.num_turns for seq in self.previous)

    def sequences(self) -> list["Trajectory"]:
        """Every token sequence of the episode as a standalone Trajectory, oldest first: `previous`,
        then this one without `previous` and with only its own turn rewards (so each one's
        `num_policy_tokens` and `turn_rewards` are its own; the last keeps the episode's facts)."""
        if not self.previous:
            return [self]
        own = self.turn_rewards_by_sequence()[-1]
        return [*self.previous, dataclasses.replace(self, previous=[], turn_rewards=own)]

    def turn_rewards_by_sequence(self) -> list[list[float]]:
        """The episode's `turn_rewards` split by sequence (one list per sequence, oldest first, one
        reward per policy span of that sequence; empty lists when the episode has no turn rewards)."""
        out, start = [], 0
        for seq in [*self.previous, self]:
            count = len(seq.policy_spans)
            out.append(list(self.turn_rewards[start : start + count]))
            start += count
        assert start == len(self.turn_rewards) or not self.turn_rewards, (
            f"{len(self.turn_rewards)} turn rewards for {start} policy turns over {len(self.previous) + 1} sequences"
        )
        return out

    def check(self) -> None:
        """Assert the internal invariants: spans tile the ids, mask is 1 exactly on policy spans
        (in every sequence of the episode)."""
        for seq in self.previous:
            assert not seq.previous, "a previous sequence cannot have sequences of its own"
            seq.check()
        position = 0
        for span in self.spans:
            assert span.start == position, f"span {span} does not start at {position}"
            assert span.end > span.start, f"empty span {span}"
            expected = 1 if span.kind == "policy" else 0
            assert all(m == expected for m in self.loss_mask[span.start : span.end]), (
                f"loss_mask is not {expected} on {span}"
            )
            position = span.end
        assert position == len(self.input_ids), f"spans cover {position} of {len(self.input_ids)} ids"


@dataclasses.dataclass
class TrajectoryBatch:
    """Right-padded tensors for a list of trajectories. Shapes: B batch, T longest length."""

    input_ids: torch.Tensor  # (B, T) long, pad_id on padding
    attention_mask: torch.Tensor  # (B, T) long, 1 on real tokens
    loss_mask: torch.Tensor  # (B, T) float, 1 on policy tokens
    logprobs: torch.Tensor  # (B, T) float, sampling log-probs, 0 elsewhere

    def to(self, device: torch.device | str) -> "TrajectoryBatch":
        return TrajectoryBatch(*(t.to(device) for t in dataclasses.astuple(self)))


def collate(trajectories: Sequence[Trajectory], pad_id: int, pad_to_multiple_of: int = 1) -> TrajectoryBatch:
    """Right-pad trajectories into tensors. Padding gets mask 0 and attention 0.

    Right padding keeps position ids equal to token indices for every row, so a plain forward
    pass scores each token exactly as the engine did.
    """
    if not trajectories:
        raise ValueError("collate() needs at least one trajectory")
    longest = max(len(t) for t in trajectories)
    longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    batch = len(trajectories)
    input_ids = torch.full((batch, longest), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((batch, longest), dtype=torch.long)  # (B, T)
    loss_mask = torch.zeros((batch, longest), dtype=torch.float32)  # (B, T)
    logprobs = torch.zeros((batch, longest), dtype=torch.float32)  # (B, T)
    for row, traj in enumerate(trajectories):
        n = len(traj)
        input_ids[row, :n] = torch.tensor(traj.input_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(traj.loss_mask, dtype=torch.float32)
        logprobs[row, :n] = torch.tensor(traj.logprobs, dtype=torch.float32)
    return TrajectoryBatch(input_ids, attention_mask, loss_mask, logprobs)
