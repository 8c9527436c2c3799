"""GRPO over multi-turn agent episodes, on the shared training loop.

    agentic-rl grpo --config configs/experiments/demo-grpo.yaml [--set loss.beta=0.04 ...]     (keys: grpo_config.py)

One optimizer step, `GRPO.step` (the "seed" GRPO, docs/design.md "What the system does", 3), reads in the order it runs:
  1. draw P prompts from the env's train split (a pure function of (seed, step));
  2. roll out G episodes per prompt with the CURRENT weights (the engine stamps the weights
     version on each trajectory; `rollout/staleness` logs how old they are when trained on);
  3. score each episode with the reward terms (each logged on its own), gathered over processes;
  4. advantages, (R_local, T) per token: r_i − mean(group) [/ std(group)] from the episode
     reward on every token of the episode, or per turn from the discounted returns
     Σ γ^k r_{t+k} of the env's per-step rewards plus the terminal reward, against the group's
     mean episode return (turn) or its mean return at the same turn (turn_position), each on
     its turn's tokens;
  5. π_old as `old_logprobs` says, and π_ref only when β > 0: the base model with adapters
     disabled (LoRA), or a frozen copy (full fine-tune). With old_logprobs: recompute π_old is the
     weights of the batch's first update, so that update's own forward is kept after it
     (`keep_first_forward`) for the μ − 1 after it: no separate re-scoring pass;
  6. clipped-ratio loss + β·k3 KL (algorithms/grpo.py) per micro-batch, gradients accumulated;
     each token's clipped surrogate times the sampler/trainer mismatch weight when
     rollout_correction is on (algorithms/rollout_correction.py; its statistics every step);
  7. the optimizer step (training/loop.py: clip, finite checks, AdamW); after a batch's first
     update its forwards are kept (π_old, the audit), then the rollout weights synced to the new
     ones, and the step's metrics.
Steps 1-5 are `GRPO.rollout_batch`. With μ = `updates_per_batch` > 1 the same rollouts serve μ
optimizer steps; π_old is the sampling log-probs recorded by the engine (or, with
old_logprobs: recompute, the first update's training forward, in the training precision). The
first batch of every run is audited before its first gradient (audit.on_start,
training/start_audit.py): prefixes and loss masks of its own episodes.
Processes split each batch by stride and gather rewards in global order (training/sampler.py),
so the advantages are exactly those of a single process.

Episodes of several token sequences (an env that changes the context; training/episodes.py):
each sequence is a row carrying its episode's advantage (turn mode: its turns' values). The
per-sequence normalisers of loss_type grpo and dr_grpo count EPISODES, not rows, so an episode of
three sequences weighs what an episode of one does (grpo: each row's token mean weighted by its
share of the episode's tokens, `episode_token_shares`); this also keeps every rank's normaliser
equal under DDP, where ranks may hold different numbers of rows (extra micro-batches are padded
with zero-loss ones). dapo/token/bnpo are token sums and need nothing.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from agentic_rl.algorithms.grpo import group_advantages, grpo_loss
from agentic_rl.algorithms.rollout_correction import rollout_correction
from agentic_rl.algorithms.turn_credit import discounted_turn_returns, token_advantages_from_turns, turn_advantages
from agentic_rl.training.episodes import Collected, episode_token_shares, pad_micro_batches, rewards_per_turn
from agentic_rl.training.batches import MicroBatch, RolloutBatch
from agentic_rl.training.gather import gather_objects
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.groups import guide
from agentic_rl.training.loop import Trainer
from agentic_rl.training.on_policy import train_on_policy
from agentic_rl.training.sampler import Sampler
from agentic_rl.training.scoring import TokenScorer, reference_logprobs
from agentic_rl.training.start_audit import RunAudit


class GRPO:
    """GRPO's state between steps: the sampler, π_ref, the audit on start, and the rollout batch
    its μ updates share."""

    def __init__(self, cfg: GRPOConfig, tokenizer: Any, reference: torch.nn.Module | None):
        self.cfg = cfg
        self.sampler = Sampler(cfg, tokenizer)
        self.reference = reference  # frozen copy (full fine-tune) or None (LoRA: adapters disabled)
        self.batch: RolloutBatch | None = None

    def bind(self, model: torch.nn.Module, accelerator: Any) -> None:
        r = self.cfg.rollout
        if (
            self.cfg.selection.dynamic_sampling or self.cfg.guidance.enabled
        ) and r.group_size % accelerator.num_processes:
            raise ValueError(
                f"selection.dynamic_sampling and guidance regroup whole groups, which needs rollout.group_size "
                f"({r.group_size}) to be a multiple of the {accelerator.num_processes} processes"
            )
        self.model, self.accelerator = model, accelerator
        self.sampler.bind(model, accelerator)
        self.audit = RunAudit.for_run(self.cfg, self.sampler, accelerator)

    def step(self, trainer: Trainer, step: int) -> dict[str, float]:
        """One optimizer step (module docstring, 1-7)."""
        started = time.perf_counter()
        batch = self.batch_for(step)  # 1-5, or the batch of the step before (μ > 1)
        data_seconds = time.perf_counter() - started
        rows = self.rows_to_train(batch)  # 6: rows whose gradient is not exactly 0
        micros = self.micro_batches(batch, rows)
        metrics = trainer.accumulate(micros, lambda micro: self.loss(trainer.model, micro))
        started = time.perf_counter()
        metrics |= trainer.optimizer_step(step)  # 7: clip, AdamW, schedule (finite or fail)
        if batch.staleness == 0:  # its forwards ran the weights that sampled the batch
            self.keep_first_forward(batch, micros)  # 5: π_old for the μ − 1 updates after it (recompute)
            self.audit.record_first_forward(batch.tensors, micros, batch.off_policy)  # the trainer's log-probs
        metrics |= self.sampler.sync_weights()  # the next batch is sampled with the new weights
        metrics |= self.audit.finish()  # after the run's first trained update: the audit's verdict
        metrics |= batch.metrics | {"rollout/staleness": float(batch.staleness), "time/data": data_seconds}
        return metrics | {"train/episodes_trained": float(len(rows)), "time/optimizer": time.perf_counter() - started}

    def batch_for(self, step: int) -> RolloutBatch:
        """The rollout batch step `step` trains on: a fresh one every μ = updates_per_batch steps (or
        when there is none yet), else the last one again; its staleness (updates since it was sampled) set."""
        if step % self.cfg.updates_per_batch == 0 or self.batch is None:
            self.batch = self.rollout_batch(step)
        self.batch.staleness = self.sampler.engine.weights_version - self.batch.weights_version
        return self.batch

    def rollout_batch(self, step: int) -> RolloutBatch:
        """Steps 1-5: this process's rows of a fresh rollout batch, with everything the loss needs."""
        cfg, sampler = self.cfg, self.sampler
        groups, draw_metrics = sampler.draw(step)  # 1-3: prompts, G episodes each, rewards (gathered)
        guided = (
            guide(
                groups,
                sampler.env_for,
                sampler.engine.chat_format,
                sampler.composer,
                sampler.engine.weights_version,
                self.accelerator,
            )
            if cfg.guidance.enabled
            else 0
        )
        collected = sampler.collate(groups, draw_metrics | {"train/guided_groups": float(guided)})
        tensors, trajs = collected.tensors, collected.trajectories
        self.audit.check_first_batch(trajs)  # the run's first batch: prefixes and masks, before any gradient
        advantages = self.advantages(collected)  # 4: (R_local, T)
        started = time.perf_counter()
        old = {
            "recompute": lambda: torch.zeros_like(tensors.logprobs),
            "sampling": lambda: tensors.logprobs,
            "detach": lambda: None,
        }[cfg.old_logprobs]()  # 5: π_old (None: π_θ.detach(); recompute: kept after the first update)
        needs_ref = cfg.loss.needs_reference  # π_ref only when β > 0
        ref = reference_logprobs(sampler.policy, self.reference, tensors, cfg, self.accelerator) if needs_ref else None
        collected.metrics["time/reference"] = time.perf_counter() - started
        off_policy = torch.tensor(
            collected.rows_of([bool(traj.info.get("off_policy")) for traj in trajs]), dtype=torch.bool
        )  # (R_local,)
        return RolloutBatch(
            collected.sequences,
            tensors,
            advantages,
            old,
            ref,
            off_policy,
            weights_version=trajs[0].weights_version if trajs else 0,
            metrics=collected.metrics,
            episodes=len(trajs),
            row_weights=episode_token_shares(tensors.loss_mask, collected.row_episode),
        )

    def advantages(self, collected: Collected) -> torch.Tensor:
        """(R_local, T) each row's advantage per token: its episode's (episode mode, on every
        token), or the values of the turns it holds, each on its turn's tokens (turn modes)."""
        cfg, trajs, global_rewards, local_rows = (
            self.cfg,
            collected.trajectories,
            collected.rewards,
            collected.local_rows,
        )
        rows, length = collected.tensors.input_ids.shape
        if cfg.advantage.mode == "episode":
            per_episode = group_advantages(global_rewards, cfg.rollout.group_size, cfg.loss.scale_rewards)[
                local_rows
            ]  # (B_local,)
            per_row = per_episode[torch.tensor(collected.row_episode, dtype=torch.long)]  # (R_local,)
            return per_row[:, None].expand(rows, length).contiguous()  # (R_local, T)
        # The turn modes: the composed reward placed on the turns (env_steps' share on its turns, the rest on the last).
        all_turns = gather_objects(
            self.accelerator, rewards_per_turn(trajs, global_rewards[local_rows].tolist(), cfg.rewards)
        )
        returns = discounted_turn_returns(all_turns, cfg.advantage.gamma_per_turn)
        baseline = "position" if cfg.advantage.mode == "turn_position" else "start"
        per_turn = turn_advantages(returns, cfg.rollout.group_size, cfg.loss.scale_rewards, baseline=baseline)
        by_row = collected.turns_by_row([per_turn[i] for i in local_rows])  # (R_local,) ragged per-turn values
        return token_advantages_from_turns(
            by_row, [seq.policy_spans for seq in collected.sequences], length
        )  # (R_local, T)

    # ---------------------------------------------------------------- micro-batches: the loss

    def rows_to_train(self, batch: RolloutBatch) -> list[int]:
        """The local rows to run forward/backward on, in batch order.

        Every term of the clipped loss is A·f(ratio), so with beta = 0 a row whose advantages are
        all 0, or that has no trained token, adds exactly 0 to the loss and to the gradient; the
        normalisers ("share" and the token count) still count it. Only live rows are returned: under
        DDP, `micro_batches` pads a rank with fewer of them with one-row dummy micro-batches."""
        cfg, tensors = self.cfg, batch.tensors
        rows = list(range(tensors.input_ids.shape[0]))
        if cfg.skip_zero_advantage and cfg.loss.zero_advantage_rows_are_inert:
            live = (batch.advantages != 0).any(-1) & (tensors.loss_mask.sum(-1) > 0)  # (R_local,)
            rows = [i for i in rows if live[i]]
        return rows  # group order: a micro-batch of one group shares its whole prompt (see sequence_logprobs)

    def micro_batches(self, batch: RolloutBatch, rows: list[int] | None = None) -> list[MicroBatch]:
        """`rows` (default: rows_to_train) in micro-batches of micro_batch_size, padded with
        zero-loss ones under DDP so every rank runs as many."""
        rows = self.rows_to_train(batch) if rows is None else rows
        n = batch.episodes or len(batch.trajectories)  # per-sequence means count episodes (RolloutBatch.episodes)
        size = self.cfg.micro_batch_size
        tokens_local = float(batch.tensors.loss_mask.sum())
        micros = [
            MicroBatch(batch, rows[start : start + size], len(rows[start : start + size]) / n, tokens_local)
            for start in range(0, len(rows), size)
        ]
        return pad_micro_batches(
            micros, self.accelerator, lambda: MicroBatch(batch, [0], 0.0, tokens_local, dummy=True)
        )

    def loss(self, model: torch.nn.Module, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the full-batch GRPO loss, and its metrics."""
        cfg, batch, rows, device = self.cfg, micro.batch, micro.rows, self.accelerator.device
        t, index = batch.tensors, torch.tensor(rows, dtype=torch.long)
        ids, attention, mask = t.input_ids[index], t.attention_mask[index], t.loss_mask[index]
        length = int(attention.sum(-1).max())  # trim the right padding the whole micro-batch shares: no compute on it

        def rows_of(tensor: torch.Tensor) -> torch.Tensor:
            return tensor[index][:, :length].to(device)  # (b, T)

        ids, attention, mask = ids[:, :length].to(device), attention[:, :length].to(device), mask[:, :length].to(device)
        bonus = cfg.loss.entropy_coef > 0
        logps, entropy = model(
            ids, attention, mask, temperature=cfg.rollout.sampling.temperature, with_entropy=True, entropy_grad=bonus
        )  # (b, T), (b, T)
        advantages = rows_of(batch.advantages)  # (b, T)
        if cfg.advantage.mode == "episode":
            advantages = advantages[:, 0]  # (b,): one value per row, so GSPO's clip fractions count sequences
        if batch.old_logprobs is None or (cfg.old_logprobs == "recompute" and batch.staleness == 0):
            old = logps.detach()  # π_θ before this batch's first optimizer step IS π_old: ratio exactly 1
        else:
            old = rows_of(batch.old_logprobs)
        off_policy = batch.off_policy[index].to(device)  # (b,): oracle demonstrations (guidance)
        if bool(off_policy.any()):  # no π_old for tokens the policy did not sample: ratio 1 (GuidanceConfig)
            old = torch.where(off_policy[:, None], logps.detach(), old)
        sampled = mask * (~off_policy)[:, None].to(mask.dtype)  # (b, T): nobody sampled an oracle demonstration
        is_weights, correction = rollout_correction(
            old, rows_of(t.logprobs), sampled, cfg.rollout_correction
        )  # t.logprobs: the sampler's; the weights are the same at each of the batch's μ updates
        ref = rows_of(batch.ref_logprobs) if batch.ref_logprobs is not None else None
        num_items = micro.tokens if cfg.loss.loss_type in ("dapo", "token") else None
        weights = (
            batch.row_weights[index].to(device)
            if batch.row_weights is not None and cfg.loss.loss_type == "grpo"
            else None
        )
        loss, metrics = grpo_loss(
            logps,
            old,
            advantages,
            mask,
            cfg.loss,
            ref,
            num_items_in_batch=num_items,
            entropy=entropy if bonus else None,
            sequence_weights=weights,
            is_weights=is_weights,
        )
        if cfg.loss.loss_type not in ("dapo", "token", "bnpo"):
            loss = loss * micro.share  # per-sequence means: weight this micro-batch by its share of episodes
        if micro.dummy:
            loss = loss * 0.0  # DDP padding: a backward pass with no gradient (MicroBatch.dummy)
        out = {k: float(v) for k, v in (metrics | correction).items()}
        out["loss/entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
        micro.logprobs = logps.detach()  # the forward's output, for keep_first_forward
        return loss, out

    def keep_first_forward(self, batch: RolloutBatch, micros: list[MicroBatch]) -> None:
        """After a batch's first update, whose forwards ran the weights that sampled it: with
        old_logprobs: recompute each trained row's log-probs from that forward (in the training
        precision) become its π_old for the μ − 1 updates after it, so no re-scoring pass runs
        (rows not trained are never read). Nothing with the other old_logprobs modes."""
        if self.cfg.old_logprobs != "recompute":
            return
        for micro in micros:
            if not micro.dummy:
                rows, length = torch.tensor(micro.rows, dtype=torch.long), micro.logprobs.shape[1]
                batch.old_logprobs[rows, :length] = micro.logprobs.float().cpu()

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict(self.batch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch = self.sampler.load_state_dict(state)


def train_grpo(cfg: GRPOConfig) -> dict[str, Any]:
    """Run our GRPO; returns {"final", "history"}. `backend: trl` runs TRL's trainer instead, which
    the caller picks (integrations/backends.py, used by the CLI and the pipeline): training/ never
    imports integrations/."""
    if cfg.backend != "agentic_rl":
        raise ValueError(
            f"train_grpo runs backend agentic_rl, not {cfg.backend!r}; call "
            "agentic_rl.integrations.backends.train_grpo_with_backend(cfg)"
        )
    return train_on_policy(
        "grpo",
        cfg,
        lambda policy, tokenizer, reference, accelerator: (GRPO(cfg, tokenizer, reference), TokenScorer(policy)),
    )
