"""Shared helpers of the GRPO and PPO trainer tests: the test-only reward and envs (registered on
import), the one tiny RL config both trainers start from, and the first-batch and gradient helpers.

A random model's rewards under the built-in terms are all equal (it never answers, and it
always fills the turn budget), so every advantage would be 0. `token_parity` below is a
test-only reward that depends on the sampled ids, so groups have reward variance.

Importing this module registers `token_parity`, `flaky_arith` and `ragged_arith`; a test module
(or a subprocess or torchrun worker) that names them in a config imports it first.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from agentic_rl.validation import load_and_validate
from agentic_rl.envs.arith import ArithEnv
from agentic_rl.envs.base import StepResult, list_envs, register_env
from agentic_rl.rewards.base import list_rewards, register_reward
from agentic_rl.training.actor_critic import ActorCritic
from agentic_rl.training.grpo import GRPO
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.ppo import PPO
from agentic_rl.training.ppo_config import PPOConfig

# ---------------------------------------------------------------------- test-only reward and envs

if "token_parity" not in list_rewards():

    @register_reward("token_parity")
    def token_parity(traj) -> float:
        """Share of the episode's policy tokens with an even id (test only: varies per sample)."""
        ids = [i for i, m in zip(traj.input_ids, traj.loss_mask) if m]
        return sum(i % 2 == 0 for i in ids) / max(1, len(ids))


if "flaky_arith" not in list_envs():

    @register_env("flaky_arith")
    class FlakyArith(ArithEnv):
        """arith whose step raises on the first task of the train split (test only)."""

        name = "flaky_arith"

        def reset(self, task):
            self._task = task
            return super().reset(task)

        def step(self, action_text):
            if self._task.id == self.tasks("train", n=1, seed=0)[0].id:
                raise RuntimeError("tool server exploded")
            return super().step(action_text)


if "ragged_arith" not in list_envs():

    @register_env("ragged_arith")
    class RaggedArith(ArithEnv):
        """arith whose first turn, when its text has an odd length, earns 0.2 and asks for another
        turn (test only: groups of one- and two-turn episodes with step rewards)."""

        name = "ragged_arith"

        def reset(self, task):
            self._turn = 0
            return super().reset(task)

        def step(self, action_text):
            self._turn += 1
            if self._turn == 1 and len(action_text) % 2:
                return StepResult(observation=[{"role": "user", "content": "Go on."}], reward=0.2, done=False)
            return super().step(action_text)


# ---------------------------------------------------------------------- the tiny run

# Both trainers' tiny run: tiny-qwen3 with LoRA r=4, 4 one-turn episodes of at most 8 tokens per
# step, rewarded by token_parity + 0.5 format. GRPO adds its group size (2 groups of G = 2).
TINY = [
    "model.name=tiny-qwen3",
    "model.lora.r=4",
    "optim.lr=1e-2",
    "rollout.batch_size=4",
    "rollout.max_turn_tokens=8",
    "rollout.max_turns=1",
    "rollout.max_episode_tokens=1024",
    "env.options={difficulty: 1}",
    "env.task_pool=8",
    "rewards=[{name: token_parity}, {name: format, weight: 0.5}]",
    "micro_batch_size=4",
    "train.progress=false",
]
GRPO_TINY = [*TINY, "rollout.group_size=2"]


def grpo_cfg(output_dir: Path, *extra: str) -> GRPOConfig:
    return load_and_validate(GRPOConfig, None, overrides=[*GRPO_TINY, f"train.output_dir={output_dir}", *extra])


def ppo_cfg(output_dir: Path, *extra: str) -> PPOConfig:
    return load_and_validate(PPOConfig, None, overrides=[*TINY, f"train.output_dir={output_dir}", *extra])


def adapters(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "adapter_model.safetensors")


# ---------------------------------------------------------------------- GRPO: the first batch and its gradient


def first_batch(cfg: GRPOConfig, mixed_precision: str = "no"):
    """(scorer, bound objective, its step-0 batch) with non-zero adapters, so π_θ ≠ π_ref and the
    KL gradient is not trivially 0; the objective's accelerator runs `mixed_precision`."""
    from agentic_rl.models.policy import load_policy
    from agentic_rl.training.common import make_accelerator
    from agentic_rl.training.scoring import TokenScorer

    torch.manual_seed(0)  # LoRA's init and the B noise below: the same batch whichever tests ran before
    policy, tokenizer, _ = load_policy(cfg.model, log=lambda *a: None)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model = TokenScorer(policy)
    objective = GRPO(cfg, tokenizer, None)
    objective.bind(model, make_accelerator(mixed_precision, 0))
    return model, objective, objective.batch_for(0)


def accumulated_gradient(model, objective: GRPO, batch) -> tuple[dict[str, torch.Tensor], list]:
    """The gradient summed over the objective's micro-batches of `batch`, and those micro-batches."""
    model.zero_grad(set_to_none=True)
    micros = objective.micro_batches(batch)
    for micro in micros:
        loss, _ = objective.loss(model, micro)
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}, micros


# ---------------------------------------------------------------------- PPO: a bound actor-critic


def random_lora(policy) -> None:
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)


def bound(cfg: PPOConfig, critic: bool = False):
    """(actor-critic, bound objective) with non-zero adapters."""
    from agentic_rl.models.policy import load_policy
    from agentic_rl.training.common import make_accelerator

    torch.manual_seed(0)  # the same adapters whichever tests ran before
    policy, tokenizer, _ = load_policy(cfg.model, log=lambda *a: None)
    random_lora(policy)
    separate = load_policy(cfg.model, log=lambda *a: None)[0] if critic else None
    model = ActorCritic(policy, separate, cfg.value.lr_multiplier)
    objective = PPO(cfg, tokenizer, None)
    objective.bind(model, make_accelerator("no", 0))
    return model, objective
