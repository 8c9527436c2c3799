"""GRPO over multi-turn agent episodes, on the shared training loop.

    agentic-rl grpo --config configs/experiments/demo-grpo.yaml [--set loss.beta=0.04 ...]     (keys: grpo_config.py)

Per optimizer step (the "seed" GRPO, DESIGN.md §3):
  1. draw P prompts from the env's train split (a pure function of (seed, step));
  2. roll out G episodes per prompt with the CURRENT weights (the engine stamps the weights
     version on each trajectory; `rollout/staleness` logs how old they are when trained on);
  3. score each episode with the reward terms (each logged on its own);
  4. advantages: r_i − mean(group) [/ std(group)], from the episode reward, or per turn from the
     discounted returns Σ γ^k r_{t+k} of the env's per-step rewards plus the terminal reward,
     against the group's mean episode return (turn) or its mean return at the same turn
     (turn_position);
  5. π_ref log-probs, only when β > 0: the base model with adapters disabled (LoRA), or a frozen
     copy (full fine-tune);
  6. clipped-ratio loss + β·k3 KL (algorithms/grpo.py), gradient accumulation over micro-batches;
     each token's clipped surrogate times the sampler/trainer mismatch weight when
     rollout_correction is on (algorithms/rollout_correction.py; its statistics every step).
With μ = `updates_per_batch` > 1 the same rollouts serve μ optimizer steps; π_old is the
sampling log-probs recorded by the engine (or one re-scoring, with old_logprobs: recompute).
The first batch of every run is audited before its first gradient (audit.on_start,
training/start_audit.py): prefixes and loss masks of its own episodes.

Distribution (torchrun / accelerate launch): the B = P·G episodes are split across ranks by
stride, so a group spans ranks:

    global rows   0  1  2  3 | 4  5  6  7      (P = 2, G = 4, world = 2)
    rank 0        0     2    | 4     6
    rank 1           1     3 |    5     7
Rewards are all-gathered and put back in global order before the group statistics, so the
advantages are exactly those of a single process; DDP then averages gradients, and every
rank's loss is scaled so that average equals the full-batch loss.

Episodes of several token sequences (an env that changes the context; training/episodes.py):
each sequence is a row carrying its episode's advantage (turn mode: its turns' values). The
per-sequence normalisers of loss_type grpo and dr_grpo count EPISODES, not rows, so an episode of
three sequences weighs what an episode of one does (grpo: each row's token mean weighted by its
share of the episode's tokens, `episode_token_shares`); this also keeps every rank's normaliser
equal under DDP, where ranks may hold different numbers of rows (extra micro-batches are padded
with zero-loss ones). dapo/token/bnpo are token sums and need nothing.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from agentic_rl.algorithms.grpo import (
    discounted_turn_returns,
    group_advantages,
    grpo_loss,
    token_advantages_from_turns,
    turn_advantages,
)
from agentic_rl.models.policy import load_policy
from agentic_rl.models.stage_output import save_final
from agentic_rl.training.common import make_accelerator
from agentic_rl.training.episodes import Collected, EpisodeObjective, episode_token_shares, pad_micro_batches, rewards_per_turn
from agentic_rl.training.grpo_batch import MicroBatch, RolloutBatch
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.groups import Group, guide
from agentic_rl.training.loop import run_training
from agentic_rl.training.run_record import start_run
from agentic_rl.training.scoring import TokenScorer, require_replicated_weights, unwrap_policy


class GRPOObjective(EpisodeObjective):
    """Advantages from groups per batch (rollouts: training/episodes.py); the clipped GRPO loss per micro-batch."""

    def bind(self, model, accelerator) -> None:
        r = self.cfg.rollout
        if (self.cfg.selection.dynamic_sampling or self.cfg.guidance.enabled) and r.group_size % accelerator.num_processes:
            raise ValueError(f"selection.dynamic_sampling and guidance regroup whole groups, which needs rollout.group_size "
                             f"({r.group_size}) to be a multiple of the {accelerator.num_processes} processes")
        super().bind(model, accelerator)

    # ---------------------------------------------------------------- batch: rollouts -> advantages

    def _after_draw(self, groups: list[Group]) -> dict[str, float]:
        guided = guide(groups, self.make_env, self.engine.chat_format, self.composer, self.engine.weights_version,
                       self.accelerator) if self.cfg.guidance.enabled else 0
        return {"train/guided_groups": float(guided)}

    def _build_batch(self, step: int) -> RolloutBatch:
        collected = self._collect(step)
        trajs, tensors = collected.trajectories, collected.tensors
        advantages = self._advantages(collected)
        off_policy = torch.tensor(collected.rows_of([bool(traj.info.get("off_policy")) for traj in trajs]), dtype=torch.bool)  # (R_local,)
        started = time.perf_counter()
        old = {"recompute": lambda: self._score(tensors, reference=False), "sampling": lambda: tensors.logprobs,
               "detach": lambda: None}[self.cfg.old_logprobs]()
        ref = self._score(tensors, reference=True) if self.cfg.loss.needs_reference else None
        collected.metrics["time/reference"] = time.perf_counter() - started
        return RolloutBatch(collected.sequences, tensors, advantages, old, ref, off_policy,
                            weights_version=trajs[0].weights_version if trajs else 0, metrics=collected.metrics,
                            episodes=len(trajs), row_weights=episode_token_shares(tensors.loss_mask, collected.row_episode))

    def _advantages(self, collected: Collected):
        """Per row: its episode's advantage (R_local,), or the values of the turns it holds (turn mode)."""
        cfg, trajs, global_rewards, local_rows = self.cfg, collected.trajectories, collected.rewards, collected.local_rows
        if cfg.advantage.mode == "episode":
            per_episode = group_advantages(global_rewards, cfg.rollout.group_size, cfg.loss.scale_rewards)[local_rows]  # (B_local,)
            return per_episode[torch.tensor(collected.row_episode, dtype=torch.long)]  # (R_local,)
        # The turn modes: the composed reward placed on the turns (env_steps' share on its turns, the rest on the last).
        all_turns = self._gather_objects(rewards_per_turn(trajs, global_rewards[local_rows].tolist(), cfg.rewards))
        returns = discounted_turn_returns(all_turns, cfg.advantage.gamma)
        baseline = "position" if cfg.advantage.mode == "turn_position" else "start"
        per_turn = turn_advantages(returns, cfg.rollout.group_size, cfg.loss.scale_rewards, baseline=baseline)
        return collected.turns_by_row([per_turn[i] for i in local_rows])  # ragged per-turn values, spread over tokens per micro-batch

    # ---------------------------------------------------------------- micro-batches: the loss

    def micro_batches(self, batch: RolloutBatch) -> list[MicroBatch]:
        n = batch.episodes or len(batch.trajectories)  # per-sequence means count episodes (RolloutBatch.episodes)
        size = self.cfg.micro_batch_size
        tokens_local = float(batch.tensors.loss_mask.sum())
        rows = self._rows_to_train(batch)
        batch.metrics["train/episodes_trained"] = float(len(rows))
        micros = [MicroBatch(batch, rows[start : start + size], len(rows[start : start + size]) / n, tokens_local)
                  for start in range(0, len(rows), size)]
        return pad_micro_batches(micros, self.accelerator, lambda: MicroBatch(batch, [0], 0.0, tokens_local, dummy=True))

    def _rows_to_train(self, batch: RolloutBatch) -> list[int]:
        """The local rows to run forward/backward on, in batch order.

        Every term of the clipped loss is A·f(ratio), so with beta = 0 a row whose advantages are
        all 0, or that has no trained token, adds exactly 0 to the loss and to the gradient; the
        normalisers ("share" and the token count) still count it. Under DDP each rank must run the
        same number of micro-batches, so a rank with fewer live rows tops up with skipped ones."""
        cfg, tensors = self.cfg, batch.tensors
        n = tensors.input_ids.shape[0]
        rows = list(range(n))
        if cfg.skip_zero_advantage and cfg.loss.zero_advantage_rows_are_inert:
            advantages = batch.advantages
            has_tokens = tensors.loss_mask.sum(-1) > 0  # (R_local,)
            if isinstance(advantages, torch.Tensor):
                live = (advantages != 0) & has_tokens
            else:
                live = torch.tensor([any(a != 0 for a in turns) for turns in advantages], dtype=torch.bool) & has_tokens
            kept = [i for i in rows if live[i]]
            micro_count = torch.tensor([-(-len(kept) // cfg.micro_batch_size)])
            if self.accelerator.num_processes > 1:
                micro_count = self.accelerator.gather(micro_count.to(self.accelerator.device)).max().cpu()
            target = min(n, int(micro_count) * cfg.micro_batch_size)
            kept += [i for i in rows if not live[i]][: target - len(kept)]
            rows = kept
        return sorted(rows)  # group order: a micro-batch of one group shares its whole prompt (see sequence_logprobs)

    def loss(self, model, micro: MicroBatch) -> tuple[torch.Tensor, dict[str, float]]:
        batch, rows, device = micro.batch, micro.rows, self.accelerator.device
        t, index = batch.tensors, torch.tensor(rows, dtype=torch.long)
        ids, attention, mask = t.input_ids[index], t.attention_mask[index], t.loss_mask[index]
        # Trim right padding shared by the whole micro-batch: no compute on it.
        length = int(attention.sum(-1).max())
        ids, attention, mask = ids[:, :length].to(device), attention[:, :length].to(device), mask[:, :length].to(device)
        bonus = self.cfg.loss.entropy_coef > 0
        logps, entropy = model(ids, attention, mask, self.cfg.rollout.temperature, True, bonus)  # (b, T), (b, T)
        advantages = batch.advantages
        if isinstance(advantages, torch.Tensor):
            adv = advantages[index].to(device)  # (b,)
        else:
            spans = [batch.trajectories[i].policy_spans for i in rows]
            adv = token_advantages_from_turns([advantages[i] for i in rows], spans, length).to(device)  # (b, T)
        old = logps.detach() if batch.old_logprobs is None else batch.old_logprobs[index][:, :length].to(device)
        off_policy = batch.off_policy[index].to(device)  # (b,): oracle demonstrations (guidance)
        if bool(off_policy.any()):  # no π_old for tokens the policy did not sample: ratio 1 (GuidanceConfig)
            old = torch.where(off_policy[:, None], logps.detach(), old)
        sampler = t.logprobs[index][:, :length].to(device)  # (b, T): the engine's record, kept by every old_logprobs mode
        sampled = mask * (~off_policy)[:, None].to(mask.dtype)  # (b, T): nobody sampled an oracle demonstration
        is_weights, correction = self._rollout_correction(batch, logps, old, sampler, sampled)
        ref = batch.ref_logprobs[index][:, :length].to(device) if batch.ref_logprobs is not None else None
        num_items = micro.tokens if self.cfg.loss.loss_type in ("dapo", "token") else None
        weights = batch.row_weights[index].to(device) if batch.row_weights is not None and self.cfg.loss.loss_type == "grpo" else None
        loss, metrics = grpo_loss(logps, old, adv, mask, self.cfg.loss, ref, num_items_in_batch=num_items,
                                  entropy=entropy if bonus else None, sequence_weights=weights, is_weights=is_weights)
        if self.cfg.loss.loss_type not in ("dapo", "token", "bnpo"):
            loss = loss * micro.share  # per-sequence means: weight this micro-batch by its share of episodes
        if micro.dummy:
            loss = loss * 0.0  # DDP padding: a backward pass with no gradient (MicroBatch.dummy)
        trained = mask.sum().clamp(min=1)
        out = {k: float(v) for k, v in metrics.items()} | correction
        out["loss/entropy"] = float((entropy.detach() * mask).sum() / trained)
        return loss, out


def train_grpo(cfg: GRPOConfig) -> dict[str, Any]:
    """Run our GRPO; returns {"final", "history"}. `backend: trl` is dispatched by the caller
    (`agentic_rl.pipeline.run_grpo`, which the CLI and the pipeline use): training/ never imports
    integrations/."""
    if cfg.backend != "agentic_rl":
        raise ValueError(f"train_grpo runs backend agentic_rl, not {cfg.backend!r}; call agentic_rl.pipeline.run_grpo(cfg)")
    accelerator = make_accelerator(cfg.train.mixed_precision, cfg.train.seed)
    require_replicated_weights(accelerator, "grpo")  # rollouts / the reward head read whole weights
    run_dir = start_run("grpo", cfg, accelerator)  # stops here if the folder holds another run
    if run_dir.finished is not None:
        return run_dir.finished
    policy, tokenizer, base_name = load_policy(cfg.model, accelerator.device, log=accelerator.print)
    reference = None
    if cfg.loss.needs_reference and not cfg.model.lora.enabled:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)  # full fine-tune: a frozen copy is π_ref
    objective = GRPOObjective(cfg, tokenizer, reference)
    history = run_training(objective, TokenScorer(policy), cfg.train, cfg.optim, accelerator, run_dir, description="grpo")
    final = save_final(unwrap_policy(objective.model, accelerator), tokenizer, Path(cfg.train.output_dir), base_name, accelerator)
    result = {"final": str(final), "history": history}
    run_dir.finish(cfg.train.steps, result)
    run_dir.close()
    return result
