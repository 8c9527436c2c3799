"""GRPO over multi-turn agent episodes, on the shared training loop.

    agentic-rl grpo --config configs/experiments/demo-grpo.yaml [--set loss.beta=0.04 ...]     (keys: grpo_config.py)

Per optimizer step (the "seed" GRPO, DESIGN.md §3):
  1. draw P prompts from the env's train split (a pure function of (seed, step));
  2. roll out G episodes per prompt with the CURRENT weights (the engine stamps the weights
     version on each trajectory; `rollout/staleness` logs how old they are when trained on);
  3. score each episode with the reward terms (each logged on its own);
  4. advantages: r_i − mean(group) [/ std(group)], from the episode reward, or per turn from the
     discounted returns Σ γ^k r_{t+k} of the env's per-step rewards plus the terminal reward;
  5. π_ref log-probs, only when β > 0: the base model with adapters disabled (LoRA), or a frozen
     copy (full fine-tune);
  6. clipped-ratio loss + β·k3 KL (algorithms/grpo.py), gradient accumulation over micro-batches.
With μ = `updates_per_batch` > 1 the same rollouts serve μ optimizer steps; π_old is the
sampling log-probs recorded by the engine (or one re-scoring, with old_logprobs: recompute).

Distribution (torchrun / accelerate launch): the B = P·G episodes are split across ranks by
stride, so a group spans ranks:

    global rows   0  1  2  3 | 4  5  6  7      (P = 2, G = 4, world = 2)
    rank 0        0     2    | 4     6
    rank 1           1     3 |    5     7
Rewards are all-gathered and put back in global order before the group statistics, so the
advantages are exactly those of a single process; DDP then averages gradients, and every
rank's loss is scaled so that average equals the full-batch loss.
"""

from __future__ import annotations

import copy
import random
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
from agentic_rl.algorithms.logprobs import sequence_logprobs
from agentic_rl.models.policy import load_policy
from agentic_rl.models.stage_output import save_final
from agentic_rl.rewards.base import RewardComposer
from agentic_rl.rollout.trajectory import Trajectory, collate
from agentic_rl.training.common import make_accelerator
from agentic_rl.training.grpo_batch import MicroBatch, RolloutBatch
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.groups import Group, PromptSelector, guide
from agentic_rl.training.loop import run_training
from agentic_rl.training.run_dir import RunDir
from agentic_rl.training.scoring import TokenScorer, require_replicated_weights, unwrap_policy


class GRPOObjective:
    """Rollouts, rewards and advantages per batch; the clipped GRPO loss per micro-batch."""

    def __init__(self, cfg: GRPOConfig, tokenizer: Any, reference: torch.nn.Module | None):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.reference = reference  # frozen copy (full fine-tune) or None (LoRA: adapters disabled)
        self.make_env = cfg.env.make
        self.task_pool = self.make_env().tasks("train", n=cfg.env.task_pool, seed=cfg.train.seed)
        extra = {}
        if cfg.reward_model.path:
            from agentic_rl.rewards.reward_model import RewardModelReward

            extra["reward_model"] = (RewardModelReward(cfg.reward_model.path), cfg.reward_model.weight)
        self.composer = RewardComposer(cfg.rewards, extra)
        self.cached: RolloutBatch | None = None
        self.selector = PromptSelector(self.task_pool, cfg.selection)

    def bind(self, model, accelerator) -> None:
        from agentic_rl.rollout.factory import build_engine

        self.model, self.accelerator = model, accelerator
        self.policy = unwrap_policy(model, accelerator)
        r = self.cfg.rollout
        if (self.cfg.selection.dynamic_sampling or self.cfg.guidance.enabled) and r.group_size % accelerator.num_processes:
            raise ValueError(f"selection.dynamic_sampling and guidance regroup whole groups, which needs rollout.group_size "
                             f"({r.group_size}) to be a multiple of the {accelerator.num_processes} processes")
        local = r.batch_size // accelerator.num_processes
        self.engine = build_engine(self.policy, self.tokenizer, r, seed=self.cfg.train.seed, max_concurrent=local)

    # ---------------------------------------------------------------- batch: rollouts -> advantages

    def next_batch(self, step: int) -> RolloutBatch:
        if step % self.cfg.updates_per_batch == 0 or self.cached is None:
            self.cached = self._rollout_batch(step)
        self.cached.staleness = self.engine.weights_version - self.cached.weights_version
        return self.cached

    def _rollout_batch(self, step: int) -> RolloutBatch:
        r, sel = self.cfg.rollout, self.cfg.selection
        prompts = r.batch_size // r.group_size
        rng = random.Random(self.cfg.train.seed * 1_000_003 + step)
        started = time.perf_counter()
        self.policy.eval()
        informative: list[Group] = []  # groups with reward variance
        flat: list[Group] = []  # groups whose G rewards are all equal
        first_round_share, rounds = 0.0, 0
        for round_index in range(1 + (sel.max_rounds if sel.dynamic_sampling else 0)):
            missing = prompts - len(informative) if sel.dynamic_sampling else prompts
            if missing == 0:
                break
            tasks = self.selector.draw(rng, missing, exclude={group.task.id for group in informative + flat})
            if not tasks:
                break
            groups = self._rollout_groups(tasks, step, round_index)
            rounds += 1
            if round_index == 0:
                first_round_share = sum(g.has_variance for g in groups) / len(groups)
            for group in groups:
                self.selector.record(group)  # every group rolled out informs the band, used or not
                (informative if group.has_variance or not sel.dynamic_sampling else flat).append(group)
        groups = informative + flat[: prompts - len(informative)]
        rollout_seconds = time.perf_counter() - started
        guided = guide(groups, self.make_env, self.tokenizer, self.composer, self.engine.weights_version,
                       self.accelerator) if self.cfg.guidance.enabled else 0
        trajs = [traj for group in groups for traj in group.local]
        global_rewards = torch.cat([group.rewards for group in groups])  # (B,) in global row order
        local_rows = list(range(self.accelerator.process_index, r.batch_size, self.accelerator.num_processes))
        advantages = self._advantages(trajs, global_rewards, local_rows)
        self.policy.train()
        tensors = collate(trajs, self.tokenizer.pad_token_id)
        for row, traj in enumerate(trajs):  # failed episodes are logged, never trained on
            if traj.finish_reason == "error":
                tensors.loss_mask[row] = 0
        off_policy = torch.tensor([bool(traj.info.get("off_policy")) for traj in trajs], dtype=torch.bool)  # (B_local,)
        started = time.perf_counter()
        old = {"recompute": lambda: self._score(tensors, reference=False), "sampling": lambda: tensors.logprobs,
               "detach": lambda: None}[self.cfg.old_logprobs]()
        ref = self._score(tensors, reference=True) if self.cfg.loss.needs_reference else None
        reference_seconds = time.perf_counter() - started
        metrics = self._batch_metrics(trajs, global_rewards, rollout_seconds)
        metrics.update({
            "time/reference": reference_seconds,
            # the share of groups whose rewards differ (the groups that carry a gradient), as
            # sampled, before dynamic sampling replaced any; and after selection and guidance
            "rollout/groups_with_variance": first_round_share,
            "train/groups_with_variance": sum(g.has_variance for g in groups) / len(groups),
            "rollout/rounds": float(rounds),
            "train/guided_groups": float(guided),
            "rollout/band_fallbacks": float(self.selector.band_fallbacks),
        })
        return RolloutBatch(trajs, tensors, advantages, old, ref, off_policy,
                            weights_version=trajs[0].weights_version if trajs else 0, metrics=metrics)

    def _rollout_groups(self, tasks: list[Any], step: int, round_index: int) -> list[Group]:
        """Roll out G episodes of each task; rows are split across processes by stride (module doc)."""
        acc, G = self.accelerator, self.cfg.rollout.group_size
        rows = [t for t in tasks for _ in range(G)]  # (P_round * G,) in group order
        local_rows = list(range(acc.process_index, len(rows), acc.num_processes))
        with torch.no_grad():
            seed = (self.cfg.train.seed * 1_000_003 + step) * 64 + acc.process_index + 1_000_000_007 * round_index
            trajs = self.engine.run([self.make_env() for _ in local_rows], [rows[i] for i in local_rows], seed=seed)
        local = torch.tensor([[reward, float(bool(t.info.get("correct")))] for reward, t in zip(self.composer(trajs), trajs)],
                             dtype=torch.float32).reshape(len(trajs), 2)  # (B_local, 2)
        table = self._gather_in_global_order(local)  # (P_round * G, 2)
        by_row = dict(zip(local_rows, trajs))
        return [Group(task, [by_row[i] for i in range(g * G, (g + 1) * G) if i in by_row],
                       table[g * G : (g + 1) * G, 0].clone(), int(table[g * G : (g + 1) * G, 1].sum()))
                for g, task in enumerate(tasks)]

    def _gather_in_global_order(self, local: torch.Tensor) -> torch.Tensor:
        acc = self.accelerator
        if acc.num_processes == 1:
            return local
        gathered = acc.gather(local.to(acc.device)).cpu()  # (B,) as [rank0 rows..., rank1 rows...]
        world, per_rank = acc.num_processes, local.shape[0]
        order = torch.empty_like(gathered)
        for rank in range(world):
            order[rank::world] = gathered[rank * per_rank : (rank + 1) * per_rank]
        return order  # (B,) in global row order

    def _advantages(self, trajs: list[Trajectory], global_rewards: torch.Tensor, local_rows: list[int]):
        cfg = self.cfg
        if cfg.advantage.mode == "episode":
            return group_advantages(global_rewards, cfg.rollout.group_size, cfg.loss.scale_rewards)[local_rows]  # (B_local,)
        # Turn mode: env per-step rewards, with the episode's composed reward added at its last turn.
        local_turns = []
        for traj, total in zip(trajs, global_rewards[local_rows].tolist()):
            turns = list(traj.turn_rewards) or [0.0]
            turns[-1] += total
            local_turns.append(turns)
        all_turns = self._gather_objects(local_turns)
        returns = discounted_turn_returns(all_turns, cfg.advantage.gamma)
        per_turn = turn_advantages(returns, cfg.rollout.group_size, cfg.loss.scale_rewards)
        return [per_turn[i] for i in local_rows]  # ragged per-turn values, spread over tokens per micro-batch

    def _gather_objects(self, local: list) -> list:
        acc = self.accelerator
        if acc.num_processes == 1:
            return local
        from accelerate.utils import gather_object

        flat = gather_object([local])
        world = acc.num_processes
        out = [None] * sum(len(part) for part in flat)
        for rank, part in enumerate(flat):
            out[rank::world] = part
        return out

    @torch.no_grad()
    def _score(self, tensors, reference: bool) -> torch.Tensor:
        """(B_local, T) log-probs under π_ref (reference=True) or the current weights, in micro-batches."""
        temperature = self.cfg.rollout.temperature
        out = torch.zeros_like(tensors.logprobs)
        step = self.cfg.micro_batch_size
        for start in range(0, tensors.input_ids.shape[0], step):
            rows = slice(start, start + step)
            args = (tensors.input_ids[rows].to(self.accelerator.device), tensors.attention_mask[rows].to(self.accelerator.device),
                    tensors.loss_mask[rows].to(self.accelerator.device))
            if reference and self.reference is not None:
                logps, _ = sequence_logprobs(self.reference, *args, temperature=temperature)
            elif reference:
                with self.policy.disable_adapter():  # π_ref = the base model: no second copy in memory
                    logps, _ = sequence_logprobs(self.policy, *args, temperature=temperature)
            else:
                logps, _ = sequence_logprobs(self.policy, *args, temperature=temperature)
            out[rows] = logps.float().cpu()
        return out

    def _batch_metrics(self, trajs: list[Trajectory], global_rewards: torch.Tensor, rollout_seconds: float) -> dict[str, float]:
        """Rollout statistics over the whole batch: under DDP every rank gathers every episode's
        numbers, so each rank logs the same values as one process would."""
        names = list(trajs[0].reward_components) if trajs else []
        stats = ["correct", "policy_tokens", "turns", "tool_calls", "tool_errors", "failed"]
        local = torch.tensor([[t.reward_components[n] for n in names] + [
            float(bool(t.info.get("correct"))), float(t.num_policy_tokens), float(len(t.policy_spans)),
            float(t.info.get("tool_calls", 0)), float(t.info.get("tool_errors", 0)), float(t.finish_reason == "error"),
        ] for t in trajs], dtype=torch.float64).reshape(len(trajs), len(names) + len(stats))  # (B_local, K)
        table = self._gather_in_global_order(local)  # (B, K)
        column = {key: table[:, i] for i, key in enumerate([*names, *stats])}
        reasons = self._gather_objects([t.finish_reason for t in trajs])  # (B,)
        metrics: dict[str, float] = {
            "reward/total/mean": float(global_rewards.mean()),
            "reward/total/std": float(global_rewards.std()) if global_rewards.numel() > 1 else 0.0,
        }
        for name in names:
            metrics[f"reward/{name}/mean"] = float(column[name].mean())
            metrics[f"reward/{name}/std"] = float(column[name].std()) if column[name].numel() > 1 else 0.0
        episodes = max(1, table.shape[0])
        metrics.update({
            "rollout/accuracy": float(column["correct"].sum()) / episodes,
            "rollout/completion_tokens/mean": float(column["policy_tokens"].sum()) / episodes,
            "rollout/completion_tokens/max": float(column["policy_tokens"].max()) if table.shape[0] else 0.0,
            "rollout/turns/mean": float(column["turns"].sum()) / episodes,
            "rollout/tool_calls/mean": float(column["tool_calls"].sum()) / episodes,
            "rollout/tool_errors/mean": float(column["tool_errors"].sum()) / episodes,
            "rollout/failed": float(column["failed"].sum()),
            # ranks decode at the same time: all of the batch's tokens over this rank's wall time
            "rollout/tokens_per_second": float(column["policy_tokens"].sum()) / max(rollout_seconds, 1e-9),
            "time/rollout": rollout_seconds,
        })
        for reason in sorted(set(reasons)):
            metrics[f"rollout/finish/{reason}"] = reasons.count(reason) / len(reasons)
        rank = f"[rank {self.accelerator.process_index}] " if self.accelerator.num_processes > 1 else ""
        for traj in trajs:  # every rank reports its own failed episodes
            if traj.finish_reason == "error":
                print(f"{rank}episode failed (task {traj.task_id}): {traj.info.get('error')}", flush=True)
        return metrics

    # ---------------------------------------------------------------- micro-batches: the loss

    def micro_batches(self, batch: RolloutBatch) -> list[MicroBatch]:
        n = len(batch.trajectories)
        size = self.cfg.micro_batch_size
        tokens_local = float(batch.tensors.loss_mask.sum())
        rows = self._rows_to_train(batch)
        batch.metrics["train/episodes_trained"] = float(len(rows))
        return [MicroBatch(batch, rows[start : start + size], len(rows[start : start + size]) / n, tokens_local)
                for start in range(0, len(rows), size)]

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
            has_tokens = tensors.loss_mask.sum(-1) > 0  # (B_local,)
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
        ref = batch.ref_logprobs[index][:, :length].to(device) if batch.ref_logprobs is not None else None
        num_items = micro.tokens if self.cfg.loss.loss_type in ("dapo", "token") else None
        loss, metrics = grpo_loss(logps, old, adv, mask, self.cfg.loss, ref, num_items_in_batch=num_items,
                                  entropy=entropy if bonus else None)
        if self.cfg.loss.loss_type not in ("dapo", "token", "bnpo"):
            loss = loss * micro.share  # per-sequence means: weight this micro-batch by its share of rows
        trained = mask.sum().clamp(min=1)
        out = {k: float(v) for k, v in metrics.items()}
        out["loss/entropy"] = float((entropy.detach() * mask).sum() / trained)
        return loss, out

    def after_step(self, step: int) -> dict[str, float]:
        metrics = dict(self.cached.metrics) if self.cached else {}
        metrics["rollout/staleness"] = float(self.cached.staleness) if self.cached else 0.0
        metrics["rollout/weights_version"] = float(self.engine.sync_weights())
        return metrics

    def state_dict(self) -> dict[str, Any]:
        # Rollouts are a pure function of (seed, step) and the weights; only a batch being reused
        # across μ > 1 updates must survive a resume.
        keep = self.cached if self.cfg.updates_per_batch > 1 else None
        return {"cached": keep, "weights_version": self.engine.weights_version, "outcomes": dict(self.selector.outcomes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cached = state.get("cached")
        self.selector.outcomes = {task: tuple(counts) for task, counts in state.get("outcomes", {}).items()}
        self.engine.sync_weights(int(state.get("weights_version", 0)))  # the backend reads the restored weights


def train_grpo(cfg: GRPOConfig) -> dict[str, Any]:
    """Run our GRPO; returns {"final", "history"}. `backend: trl` is dispatched by the caller
    (`agentic_rl.pipeline.run_grpo`, which the CLI and the pipeline use): training/ never imports
    integrations/."""
    if cfg.backend != "agentic_rl":
        raise ValueError(f"train_grpo runs backend agentic_rl, not {cfg.backend!r}; call agentic_rl.pipeline.run_grpo(cfg)")
    accelerator = make_accelerator(cfg.train.mixed_precision, cfg.train.seed)
    require_replicated_weights(accelerator, "grpo")  # rollouts / the reward head read whole weights
    run_dir = RunDir(cfg.train.output_dir, cfg, enabled=accelerator.is_main_process)
    policy, tokenizer, base_name = load_policy(cfg.model, accelerator.device, log=accelerator.print)
    if cfg.rollout.batch_size % accelerator.num_processes:
        raise ValueError(f"rollout.batch_size={cfg.rollout.batch_size} must be a multiple of the {accelerator.num_processes} processes")
    reference = None
    if cfg.loss.needs_reference and not cfg.model.lora.enabled:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)  # full fine-tune: a frozen copy is π_ref
    objective = GRPOObjective(cfg, tokenizer, reference)
    history = run_training(objective, TokenScorer(policy), cfg.train, cfg.optim, accelerator, run_dir, description="grpo")
    final = save_final(unwrap_policy(objective.model, accelerator), tokenizer, Path(cfg.train.output_dir), base_name, accelerator)
    run_dir.close()
    return {"final": str(final), "history": history}
