"""`Sampler`: the rollout side of an on-policy run (GRPO, PPO): draw prompts, roll out G episodes
of each with the current weights, score them with the reward terms, gather what a multi-process
run needs, and collate this process's rows for the loss.

    sampler = Sampler(cfg, tokenizer)                   # one per run
    sampler.bind(model, accelerator)                    # the engine, on the prepared model's policy
    groups, draw_metrics = sampler.draw(step)          # prompts -> G episodes each -> rewards
    collected = sampler.collate(groups, draw_metrics)   # rows, (R_local, T) tensors, statistics
    ...                                                 # the algorithm's advantages, loss, update
    metrics = sampler.sync_weights()                    # the next batch samples the new weights

Its config must carry the sections of episode_config.py (env, rollout, reward_model) plus rewards,
selection and train.

Distribution (torchrun / accelerate launch): the B = P·G episodes are split across ranks by
stride, so a group spans ranks:

    global rows   0  1  2  3 | 4  5  6  7      (P = 2, G = 4, world = 2)
    rank 0        0     2    | 4     6
    rank 1           1     3 |    5     7
Rewards and statistics are all-gathered and put back in global order, so every rank computes
exactly what a single process would: the group statistics, hence the advantages, are those of
one process; DDP then averages gradients, and every rank's loss is scaled so that average
equals the full-batch loss. An episode of several token sequences becomes several rows
(training/episodes.py).
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from agentic_rl.rewards.base import RewardComposer, reported_terms
from agentic_rl.rewards.reward_model import RewardModelReward
from agentic_rl.rollout.factory import build_engine
from agentic_rl.rollout.trajectory import collate
from agentic_rl.training.episodes import Collected
from agentic_rl.training.gather import gather_in_global_order
from agentic_rl.training.groups import Group, PromptSelector
from agentic_rl.training.rollout_metrics import rollout_statistics
from agentic_rl.training.scoring import unwrap_policy


class Sampler:
    """The rollout side of an on-policy run: env, engine, rewards, prompt selection (module
    docstring). One per run; `bind` it to the prepared model before the first draw."""

    def __init__(self, cfg: Any, tokenizer: Any):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.env_for = cfg.env.env_for  # task -> a fresh env (its mix part's, with env.mix)
        self.task_pool = cfg.env.train_tasks(cfg.train.seed)
        extra = {}
        if cfg.reward_model.path:
            extra["reward_model"] = (RewardModelReward(cfg.reward_model.path), cfg.reward_model.weight)
        extra.update(reported_terms(cfg.env.reward_terms()))  # the env's named reward parts, logged at weight 0
        self.composer = RewardComposer(cfg.rewards, extra)
        self.selector = PromptSelector(self.task_pool, cfg.selection)

    def bind(self, model: torch.nn.Module, accelerator: Any) -> None:
        """Build the rollout engine on the prepared model's policy (its weights, shared, not copied)."""
        self.accelerator = accelerator
        self.policy = unwrap_policy(model, accelerator)
        if self.cfg.rollout.batch_size % accelerator.num_processes:
            raise ValueError(
                f"rollout.batch_size={self.cfg.rollout.batch_size} must be a multiple of the "
                f"{accelerator.num_processes} processes"
            )
        local = self.cfg.rollout.batch_size // accelerator.num_processes
        self.engine = build_engine(
            self.policy, self.tokenizer, self.cfg.rollout, seed=self.cfg.train.seed, max_concurrent=local
        )

    # ---------------------------------------------------------------- rollouts

    def draw(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """The step's P groups of G episodes, rolled out with the current weights and scored, with
        selection's band and dynamic sampling (SelectionConfig); rewards gathered over processes.
        Returns the groups and the draw's metrics (`time/rollout` included)."""
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
        self.policy.train()
        return informative + flat[: prompts - len(informative)], {
            # the share of groups whose rewards differ (the groups that carry a gradient), as
            # sampled, before dynamic sampling replaced any
            "rollout/groups_with_variance": first_round_share,
            "rollout/rounds": float(rounds),
            "rollout/band_fallbacks": float(self.selector.band_fallbacks),
            "time/rollout": time.perf_counter() - started,
        }

    def collate(self, groups: list[Group], draw_metrics: dict[str, float]) -> Collected:
        """This process's episodes of `groups` as training rows: (R_local, T) tensors (failed
        episodes masked out) and the batch's rollout statistics."""
        r = self.cfg.rollout
        trajs = [traj for group in groups for traj in group.local]
        global_rewards = torch.cat([group.rewards for group in groups])  # (B,) in global row order
        local_rows = list(range(self.accelerator.process_index, r.batch_size, self.accelerator.num_processes))
        sequences = [seq for traj in trajs for seq in traj.sequences()]  # (R_local,) rows
        row_episode = [episode for episode, traj in enumerate(trajs) for _ in traj.sequences()]  # (R_local,)
        tensors = collate(sequences, self.tokenizer.pad_token_id)
        for row, episode in enumerate(row_episode):  # failed episodes are logged, never trained on
            if trajs[episode].finish_reason == "error":
                tensors.loss_mask[row] = 0
        metrics = rollout_statistics(trajs, global_rewards, draw_metrics["time/rollout"], self.accelerator, self.cfg)
        metrics.update(draw_metrics)
        # the share of groups with reward variance after selection (and guidance)
        metrics["train/groups_with_variance"] = sum(g.has_variance for g in groups) / len(groups)
        if metrics["train/groups_with_variance"] == 0 and metrics["rollout/accuracy"] == 0:
            self.accelerator.print(
                "WARNING: no episode of this batch succeeded and every group's rewards are equal, so this update's "
                "gradient is zero: the policy cannot learn from a task it never solves. Start from an SFT model "
                "(agentic-rl sft, or the pipeline), set guidance.enabled: true (the env's oracle completes part of "
                "a group), or use an easier split or difficulty (train/groups_with_variance in metrics.jsonl)",
                flush=True,
            )
        for part in range(len(self.cfg.env.mix)):  # env.mix: how each part of the task mix fares
            mine = [g for g in groups if g.task.meta["mix_part"] == part]
            if mine:
                metrics[f"rollout/mix{part}/accuracy"] = sum(g.correct for g in mine) / sum(
                    len(g.rewards) for g in mine
                )
                metrics[f"rollout/mix{part}/groups_with_variance"] = sum(g.has_variance for g in mine) / len(mine)
        metrics["rollout/sequences_per_episode"] = len(sequences) / max(
            1, len(trajs)
        )  # this rank's; 1: every history a prefix
        return Collected(groups, trajs, global_rewards, local_rows, tensors, metrics, sequences, row_episode)

    def _rollout_groups(self, tasks: list[Any], step: int, round_index: int) -> list[Group]:
        """Roll out G episodes of each task; rows are split across processes by stride (module doc)."""
        acc, G = self.accelerator, self.cfg.rollout.group_size
        rows = [t for t in tasks for _ in range(G)]  # (P_round * G,) in group order
        local_rows = list(range(acc.process_index, len(rows), acc.num_processes))
        with torch.no_grad():
            seed = (self.cfg.train.seed * 1_000_003 + step) * 64 + acc.process_index + 1_000_000_007 * round_index
            trajs = self.engine.run(
                [self.env_for(rows[i]) for i in local_rows], [rows[i] for i in local_rows], seed=seed
            )
        local = torch.tensor(
            [[reward, float(bool(t.info.get("correct")))] for reward, t in zip(self.composer(trajs), trajs)],
            dtype=torch.float32,
        ).reshape(len(trajs), 2)  # (B_local, 2)
        table = gather_in_global_order(self.accelerator, local)  # (P_round * G, 2)
        by_row = dict(zip(local_rows, trajs))
        return [
            Group(
                task,
                [by_row[i] for i in range(g * G, (g + 1) * G) if i in by_row],
                table[g * G : (g + 1) * G, 0].clone(),
                int(table[g * G : (g + 1) * G, 1].sum()),
            )
            for g, task in enumerate(tasks)
        ]

    def sync_weights(self) -> dict[str, float]:
        """Sync the rollout weights to the ones the optimizer just stepped: the engine stamps the new
        version on the episodes it samples next."""
        return {"rollout/weights_version": float(self.engine.sync_weights())}

    def state_dict(self, batch: Any) -> dict[str, Any]:
        # Rollouts are a pure function of (seed, step) and the weights; only a batch being reused
        # across μ > 1 updates must survive a resume.
        keep = batch if self.cfg.updates_per_batch > 1 else None
        return {
            "cached": keep,
            "weights_version": self.engine.weights_version,
            "outcomes": dict(self.selector.outcomes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> Any:
        """Restore the selector and the weights version; returns the batch being reused (or None)."""
        self.selector.outcomes = {task: tuple(counts) for task, counts in state.get("outcomes", {}).items()}
        self.engine.sync_weights(int(state.get("weights_version", 0)))  # the backend reads the restored weights
        return state.get("cached")
