"""PPO over multi-turn agent episodes, with a value model and GAE, on the shared training loop.

    agentic-rl ppo --config configs/experiments/demo-ppo.yaml [--set value.critic=separate ...]   (keys: ppo_config.py)

One optimizer step, `PPO.step`, reads in the order it runs (steps 1-4 are `PPO.rollout_batch`;
rollouts as for GRPO: training/episodes.py):
  1. draw P prompts, roll out G episodes of each (G = 1 by default) with the current weights;
  2. rewards per token: the composed episode reward placed on its turns (`rewards_per_turn`: the
     env_steps term's share on the last token of each turn, the rest on the episode's last
     policy token; the sum is the episode's reward), and with KL in the reward
     (loss.kl_mode: reward, β > 0) −β(log π_old − log π_ref) on every policy token;
  3. one no-grad pass of the actor-critic: V_old at every policy token (and π_old with
     old_logprobs: recompute); π_ref only when β > 0;
  4. GAE(γ, λ) over each episode's policy tokens, across its tool observations
     (algorithms/ppo.py), returns R = A + V_old; the advantages whitened over the whole batch.
     An episode of several token sequences (an env that changes the context: one row each,
     training/episodes.py) runs GAE across them too (`sequence_gae`: a sequence's last policy
     token bootstraps from the next sequence's first), so its credit is what one sequence gets;
  5. the clipped surrogate + vf_coef · clipped value loss (+ β·k3 with kl_mode: loss), averaged
     over the batch's policy tokens, with gradient accumulation over micro-batches;
  6. the optimizer step (training/loop.py), the rollout weights synced, the step's metrics.
With μ = updates_per_batch > 1 the batch (its advantages, returns and V_old) serves μ steps.
As in GRPO, rollout_correction weights the clipped surrogate by the sampler/trainer mismatch
(its statistics every step), and the first batch is audited before its first gradient.

Under DDP the whitening statistics and the token count are summed over processes, so every
rank normalises exactly as one process would; DDP averages gradients, and each rank's loss is
divided by (the batch's policy tokens / processes), so that average is the full-batch mean.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from agentic_rl.algorithms.ppo import (
    kl_penalized_rewards,
    masked_moments,
    ppo_loss,
    sequence_gae,
    token_rewards,
    whiten,
)
from agentic_rl.algorithms.rollout_correction import rollout_correction
from agentic_rl.models.policy import load_policy
from agentic_rl.models.reward_scorer import is_reward_model_folder, load_reward_backbone
from agentic_rl.rollout.trajectory import TrajectoryBatch
from agentic_rl.training.actor_critic import ActorCritic
from agentic_rl.training.batches import PPOBatch, PPOMicroBatch
from agentic_rl.training.episodes import pad_micro_batches, rewards_per_turn
from agentic_rl.training.loop import Trainer
from agentic_rl.training.on_policy import train_on_policy
from agentic_rl.training.ppo_config import PPOConfig
from agentic_rl.training.sampler import Sampler
from agentic_rl.training.scoring import reference_logprobs
from agentic_rl.training.start_audit import RunAudit


class PPO:
    """PPO's state between steps: the episode machinery and the rollout batch its μ updates share."""

    def __init__(self, cfg: PPOConfig, tokenizer: Any, reference: torch.nn.Module | None):
        self.cfg = cfg
        self.sampler = Sampler(cfg, tokenizer)
        self.reference = reference  # frozen copy (full fine-tune) or None (LoRA: adapters disabled)
        self.batch: PPOBatch | None = None

    def bind(self, model: torch.nn.Module, accelerator: Any) -> None:
        self.model, self.accelerator = model, accelerator
        self.sampler.bind(model, accelerator)
        self.audit = RunAudit.for_run(self.cfg, self.sampler, accelerator)

    def step(self, trainer: Trainer, step: int) -> dict[str, float]:
        """One optimizer step (module docstring, 1-6)."""
        started = time.perf_counter()
        batch = self.batch_for(step)  # 1-4, or the batch of the step before (μ > 1)
        data_seconds = time.perf_counter() - started
        micros = self.micro_batches(batch)
        metrics = trainer.accumulate(micros, lambda micro: self.loss(trainer.model, micro))  # 5
        started = time.perf_counter()
        metrics |= trainer.optimizer_step(step)  # 6: clip, AdamW, schedule (finite or fail)
        if batch.staleness == 0:  # its forwards ran the weights that sampled the batch
            self.audit.record_first_forward(batch.tensors, micros)  # the trainer's log-probs
        metrics |= self.sampler.sync_weights()  # the next batch is sampled with the new weights
        metrics |= self.audit.finish()  # after the run's first trained update: the audit's verdict
        metrics |= batch.metrics | {"rollout/staleness": float(batch.staleness), "time/data": data_seconds}
        return metrics | {"time/optimizer": time.perf_counter() - started}

    def batch_for(self, step: int) -> PPOBatch:
        """The rollout batch step `step` trains on: a fresh one every μ = updates_per_batch steps (or
        when there is none yet), else the last one again; its staleness (updates since it was sampled) set."""
        if step % self.cfg.updates_per_batch == 0 or self.batch is None:
            self.batch = self.rollout_batch(step)
        self.batch.staleness = self.sampler.engine.weights_version - self.batch.weights_version
        return self.batch

    def rollout_batch(self, step: int) -> PPOBatch:
        """Steps 1-4: this process's rows of a fresh rollout batch, with everything the loss needs."""
        cfg, sampler = self.cfg, self.sampler
        groups, draw_metrics = sampler.draw(step)  # 1: prompts, G episodes each, rewards (gathered)
        collected = sampler.collate(groups, draw_metrics)
        trajs, t = collected.trajectories, collected.tensors
        self.audit.check_first_batch(trajs)  # the run's first batch: prefixes and masks, before any gradient
        mask = t.loss_mask  # (R_local, T): one row per token sequence
        started = time.perf_counter()
        old_values, recomputed = self._value_pass(t)  # 3: (R_local, T) each
        old = {"recompute": recomputed, "sampling": t.logprobs, "detach": None}[cfg.old_logprobs]
        needs_ref = cfg.loss.needs_reference  # π_ref only when β > 0
        ref = reference_logprobs(sampler.policy, self.reference, t, cfg, self.accelerator) if needs_ref else None
        collected.metrics["time/reference"] = time.perf_counter() - started
        # 2: the composed reward on its turns, then on each turn's last token
        per_turn = collected.turns_by_row(
            rewards_per_turn(trajs, collected.rewards[collected.local_rows].tolist(), cfg.rewards)
        )
        per_turn = [
            turns if bool(mask[row].any()) else [] for row, turns in enumerate(per_turn)
        ]  # untrained rows: no reward
        rewards = token_rewards(
            per_turn, [seq.policy_spans for seq in collected.sequences], mask.shape[1]
        )  # (R_local, T) float64
        if ref is not None and cfg.loss.kl_mode == "reward":
            behaviour = (old if old is not None else t.logprobs).double()  # the weights that sampled the tokens
            shaped = kl_penalized_rewards(rewards, behaviour, ref.double(), mask, cfg.loss.beta)
            collected.metrics["value/kl_in_reward"] = self._masked_mean(rewards - shaped, mask)
            rewards = shaped
        advantages, returns = sequence_gae(
            rewards, old_values.double(), mask, cfg.loss.gamma_per_token, cfg.loss.lam_per_token, collected.row_episode
        )  # 4: (R_local, T)
        moments = self._global_moments(advantages, mask)
        if (
            cfg.loss.whiten_advantages and float(moments[0]) >= 2
        ):  # fewer trained tokens (every episode failed): nothing to whiten
            advantages = whiten(advantages, mask, moments=moments)
        residual = self._global_moments(returns - old_values.double(), mask)
        target = self._global_moments(returns, mask)
        collected.metrics.update(
            {
                "value/mean": self._masked_mean(old_values.double(), mask),
                "value/returns_mean": float(target[1] / target[0].clamp(min=1)),
                "value/explained_variance": _explained_variance(residual, target),
            }
        )
        return PPOBatch(
            collected.sequences,
            t,
            old,
            ref if cfg.loss.kl_mode == "loss" else None,
            old_values,
            advantages.float(),
            returns.float(),
            tokens=float(moments[0]) / self.accelerator.num_processes,
            weights_version=trajs[0].weights_version if trajs else 0,
            metrics=collected.metrics,
        )

    @torch.no_grad()
    def _value_pass(self, t: TrajectoryBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(V_old, log π_θ) at every policy token, (R_local, T) each, in micro-batches, with the
        precision the loss will run in (so V_old is the value the first update starts from)."""
        model = self.accelerator.unwrap_model(self.model)
        values, logps = torch.zeros_like(t.logprobs), torch.zeros_like(t.logprobs)
        device, step = self.accelerator.device, self.cfg.micro_batch_size
        for start in range(0, t.input_ids.shape[0], step):
            rows = slice(start, start + step)
            with self.accelerator.autocast():
                lp, _, v = model(
                    t.input_ids[rows].to(device),
                    t.attention_mask[rows].to(device),
                    t.loss_mask[rows].to(device),
                    self.cfg.rollout.sampling.temperature,
                )
            values[rows], logps[rows] = v.float().cpu(), lp.float().cpu()
        return values, logps

    def _global_moments(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(3,) [count, sum, sum of squares] over every process's policy tokens."""
        local = masked_moments(values, mask)
        if self.accelerator.num_processes == 1:
            return local
        return self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu()

    def _masked_mean(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        moments = self._global_moments(values, mask)
        return float(moments[1] / moments[0].clamp(min=1))

    # ---------------------------------------------------------------- micro-batches: the loss

    def micro_batches(self, batch: PPOBatch) -> list[PPOMicroBatch]:
        # Every row has a value loss, so none is inert; rows without a policy token add exactly 0.
        size, n = self.cfg.micro_batch_size, len(batch.trajectories)
        micros = [PPOMicroBatch(batch, list(range(start, min(start + size, n)))) for start in range(0, n, size)]
        return pad_micro_batches(micros, self.accelerator, lambda: PPOMicroBatch(batch, [0], dummy=True))

    def loss(self, model, micro: PPOMicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        batch, device = micro.batch, self.accelerator.device
        t, index = batch.tensors, torch.tensor(micro.rows, dtype=torch.long)
        ids, attention, mask = t.input_ids[index], t.attention_mask[index], t.loss_mask[index]
        length = int(attention.sum(-1).max())  # trim the right padding the whole micro-batch shares
        ids, attention, mask = ids[:, :length].to(device), attention[:, :length].to(device), mask[:, :length].to(device)

        def rows_of(tensor: torch.Tensor) -> torch.Tensor:
            return tensor[index][:, :length].to(device)

        bonus = self.cfg.loss.entropy_coef > 0
        logps, entropy, values = model(
            ids,
            attention,
            mask,
            temperature=self.cfg.rollout.sampling.temperature,
            with_entropy=True,
            entropy_grad=bonus,
        )  # (b, T) each
        old = logps.detach() if batch.old_logprobs is None else rows_of(batch.old_logprobs)
        ref = rows_of(batch.ref_logprobs) if batch.ref_logprobs is not None else None
        is_weights, correction = rollout_correction(
            old, rows_of(t.logprobs), mask, self.cfg.rollout_correction
        )  # t.logprobs: the sampler's
        loss, metrics = ppo_loss(
            logps,
            old,
            values,
            rows_of(batch.old_values),
            rows_of(batch.advantages),
            rows_of(batch.returns),
            mask,
            self.cfg.loss,
            ref_logps=ref,
            entropy=entropy if bonus else None,
            num_tokens=batch.tokens,
            is_weights=is_weights,
        )
        out = {k: float(v) for k, v in (metrics | correction).items()}
        out["loss/entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
        micro.logprobs = logps.detach()  # the forward's output: the audit reads the first update's
        return (loss * 0.0 if micro.dummy else loss), out

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict(self.batch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch = self.sampler.load_state_dict(state)


def _explained_variance(residual: torch.Tensor, target: torch.Tensor) -> float:
    """1 − Var(R − V) / Var(R) from the moments of the residual and the returns; NaN (logged as
    null) when every return is equal, where it is undefined (a batch whose episodes all failed)."""
    target_variance = _variance(target)
    return 1.0 - _variance(residual) / target_variance if target_variance > 1e-12 else float("nan")


def _variance(moments: torch.Tensor) -> float:
    count, total, squares = (float(x) for x in moments)
    if count < 2:
        return 0.0
    return max(squares - total * total / count, 0.0) / (count - 1)


def load_critic(
    cfg: PPOConfig, tokenizer: Any, device: Any = "cpu", log=print
) -> tuple[torch.nn.Module | None, torch.Tensor | None]:
    """(critic, its value head's first weight): (None, None) for critic: shared; for separate, a
    copy of `value.model` (default: the policy's model) with fresh adapters and a zero head, or,
    when `value.model` is an `agentic-rl rm` folder, the reward model's decoder and score weights."""
    if cfg.value.critic != "separate":
        return None, None
    name = cfg.value.model or cfg.model.name
    if is_reward_model_folder(name):
        critic, critic_tokenizer, head_weight = load_reward_backbone(name, cfg.model, device, log=log)
    else:
        critic, critic_tokenizer, _ = load_policy(dataclasses.replace(cfg.model, name=name), device, log=log)
        head_weight = None
    if critic_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"value.model={name!r} has another tokenizer than the policy {cfg.model.name!r}; "
            "the critic reads the policy's token ids, so it needs the same vocabulary"
        )
    return critic, head_weight


def train_ppo(cfg: PPOConfig) -> dict[str, Any]:
    """Run PPO; returns {"final", "history"}. `final/` holds the policy only (as GRPO's); the value
    model lives in the checkpoints, for resume."""

    def build(policy, tokenizer, reference, accelerator):
        critic, head_weight = load_critic(cfg, tokenizer, accelerator.device, log=accelerator.print)
        return PPO(cfg, tokenizer, reference), ActorCritic(policy, critic, cfg.value.lr_multiplier, head_weight)

    return train_on_policy("ppo", cfg, build)
