"""`ActorCritic`: the module PPO's training loop prepares: the policy and its value model.

    shared (default)                          separate
    ids ─► policy backbone ─► h ─► LM head    ids ─► policy backbone ─► h ─► LM head ─► log π
                              └──► value head                ids ─► critic backbone ─► h' ─► value head ─► V
Both read the hidden state at every position whose next token is trained (the state the policy
samples that token from), so V(s_t) sits at the same (B, T) place as log π(a_t | s_t):
values[b, t] is the value of the state before token t. The head starts at zero (V ≡ 0), so the
first batch's advantages are the plain returns, and nothing random enters the first step. A
separate critic started from a reward model (`value.model` an `agentic-rl rm` folder) is that
model's decoder, and its head starts from the RM's score weights: its first V(s) is the RM's
score of the conversation up to s (Bradley-Terry scores: right in order, arbitrary in offset;
with γ = 1, the default, GAE's δ_t = r_t + γV(s_t+1) − V(s_t) sees an offset only at the
episode's last token, where V(end) = 0, and the value loss then learns it away).

Memory: shared adds H + 1 parameters and no activations; separate adds a whole second model
(its weights, adapters, activations and optimizer state): measured in benchmarks/ppo_vs_grpo.py.
"""

from __future__ import annotations

import torch
from torch import nn

from agentic_rl.models.logprobs import logprobs_from_hidden, scatter_rows, scored_hidden_states
from agentic_rl.models.backbone import unwrap_causal_lm
from agentic_rl.training.scoring import TokenScorer


class ActorCritic(TokenScorer):
    """forward -> (logps (B, T), entropy (B, T) | None, values (B, T)); 0 off the trained positions."""

    def __init__(
        self,
        policy: nn.Module,
        critic: nn.Module | None = None,
        value_lr_multiplier: float = 1.0,
        value_head_weight: torch.Tensor | None = None,
    ):
        super().__init__(policy)
        self.critic = critic  # None: the value head reads the policy's own hidden states
        hidden_size = unwrap_causal_lm(critic if critic is not None else policy).config.hidden_size
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        if value_head_weight is not None:  # (1, H): e.g. a reward model's score head
            if tuple(value_head_weight.shape) != (1, hidden_size):
                raise ValueError(f"value_head_weight must be (1, {hidden_size}), got {tuple(value_head_weight.shape)}")
            with torch.no_grad():
                self.value_head.weight.copy_(value_head_weight)
        self.value_lr_multiplier = value_lr_multiplier

    def forward(
        self,
        input_ids,
        attention_mask,
        loss_mask,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ):
        hidden, scored = scored_hidden_states(self.policy, input_ids, attention_mask, loss_mask)  # (N, H), (B, T-1)
        logps, entropy = logprobs_from_hidden(
            self.policy, hidden, scored, input_ids, temperature, with_entropy, entropy_grad
        )
        if self.critic is not None:
            hidden, _ = scored_hidden_states(self.critic, input_ids, attention_mask, loss_mask)  # (N, H')
        values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()  # (N,)
        return logps, entropy, scatter_rows(values, scored)  # (B, T) each

    def optimizer_groups(self, lr: float) -> list[dict]:
        """AdamW parameter groups: the policy's trainable weights at lr, the value model's
        (head, and a separate critic's trainable weights) at lr × value_lr_multiplier."""
        value = list(self.value_head.parameters())
        if self.critic is not None:
            value += [p for p in self.critic.parameters() if p.requires_grad]
        policy = [p for p in self.policy.parameters() if p.requires_grad]
        return [{"params": policy, "lr": lr}, {"params": value, "lr": lr * self.value_lr_multiplier}]
