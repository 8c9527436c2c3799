"""The on-policy building blocks GRPO and PPO share: draw prompts, roll out their episodes
with the current weights, score them, gather what a multi-process run needs, score log-probs,
audit the run's first batch, and keep the rollout weights in sync after each update.

    episodes = Episodes(cfg, tokenizer, reference)     # one per run; bound to the prepared model
    groups, draw_metrics = episodes.draw(step)         # prompts -> G episodes each -> rewards
    collected = episodes.collate(groups, draw_metrics)  # rows, (R_local, T) tensors, statistics
    ...                                                 # the algorithm's advantages, loss, update
    episodes.audit_first_forward(tensors, micros)      # a batch's first update: the audit's trainer side
    metrics = episodes.sync_weights()                   # the next batch samples the new weights
    metrics |= episodes.finish_audit()                  # the run's first update: the audit's verdict

Each algorithm's step (training/grpo.py, training/ppo.py) calls them in that order; the command
driver around the steps is training/on_policy.py. Its config
must carry the sections of episode_config.py (env, rollout, reward_model, audit) plus rewards,
rollout_correction, selection, updates_per_batch, micro_batch_size and train.

Distribution (torchrun / accelerate launch): the B = P·G episodes are split across ranks by
stride, so a group spans ranks:

    global rows   0  1  2  3 | 4  5  6  7      (P = 2, G = 4, world = 2)
    rank 0        0     2    | 4     6
    rank 1           1     3 |    5     7
Rewards and statistics are all-gathered and put back in global order, so every rank computes
exactly what a single process would: the group statistics, hence the advantages, are those of
one process; DDP then averages gradients, and every rank's loss is scaled so that average
equals the full-batch loss.

Episodes whose history is not a prefix (an env that changes the context, e.g. memory's window)
hold several token sequences (Trajectory.previous). Rewards, groups and advantages are per
episode, as always; only after them is each episode expanded into one training row per sequence,
each with its own mask and log-probs and its episode's advantage (or its turns' share of the
per-turn values). The stride split stays over episodes, so a rank may hold more rows than another:

    episodes      e0 (1 sequence)   e1 (3 sequences)   e2 (1)      local rows: 5
    rows          r0                r1 r2 r3           r4          row_episode [0, 1, 1, 1, 2]
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import torch

from agentic_rl.algorithms.logprobs import sequence_logprobs
from agentic_rl.errors import RunStopped
from agentic_rl.rewards.base import RewardComposer, RewardSpec, reported_terms
from agentic_rl.rollout.trajectory import Trajectory, TrajectoryBatch, collate
from agentic_rl.training.gather import combine_drift, gather_in_global_order, gather_objects, sum_over_processes
from agentic_rl.training.groups import Group, PromptSelector
from agentic_rl.training.scoring import unwrap_policy
from agentic_rl.training.start_audit import AuditFailed, StartAudit


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


class Episodes:
    """The rollout side of an on-policy run: env, engine, rewards, prompt selection, the audit on
    start (module docstring). One per run; `bind` it to the prepared model before the first draw."""

    def __init__(self, cfg: Any, tokenizer: Any, reference: torch.nn.Module | None):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.reference = reference  # frozen copy (full fine-tune) or None (LoRA: adapters disabled)
        self.env_for = cfg.env.env_for  # task -> a fresh env (its mix part's, with env.mix)
        self.task_pool = cfg.env.train_tasks(cfg.train.seed)
        extra = {}
        if cfg.reward_model.path:
            from agentic_rl.rewards.reward_model import RewardModelReward

            extra["reward_model"] = (RewardModelReward(cfg.reward_model.path), cfg.reward_model.weight)
        extra.update(reported_terms(cfg.env.reward_terms()))  # the env's named reward parts, logged at weight 0
        self.composer = RewardComposer(cfg.rewards, extra)
        self.cached: Any = None
        self.selector = PromptSelector(self.task_pool, cfg.selection)

    def bind(self, model, accelerator) -> None:
        from agentic_rl.rollout.factory import build_engine

        self.model, self.accelerator = model, accelerator
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
        self.start_audit = self._make_start_audit() if self.cfg.audit.on_start else None

    def _make_start_audit(self) -> StartAudit:
        from agentic_rl.models.precision import decoded_dtype

        rollout_dtype = self.cfg.rollout.dtype
        decodes = decoded_dtype(rollout_dtype, self.accelerator.device)
        float32 = (
            decodes == "float32" and self.cfg.model.dtype == "float32" and self.accelerator.mixed_precision == "no"
        )
        return StartAudit(
            self.engine.chat_format, self.env_for(self.task_pool[0]).tool_schemas, float32, log=self.accelerator.print
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
        episodes masked out), the batch's rollout statistics, and the audit of the run's first batch."""
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
        metrics = self._batch_metrics(trajs, global_rewards, draw_metrics["time/rollout"])
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
        if self.start_audit is not None and not self.start_audit.episodes_checked:
            self._audit_episodes(trajs)
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

    def _audit_episodes(self, trajs: list[Trajectory]) -> None:
        """The audit's prefix and mask checks of the first batch, before any gradient; every
        process stops if any one's episodes fail (a rank alone would leave the others waiting)."""
        failure = self.start_audit.check_episodes(trajs)
        failed_somewhere = sum_over_processes(self.accelerator, float(failure is not None))
        if failure is not None:
            raise AuditFailed(failure)
        if failed_somewhere:
            raise AuditFailed(
                "audit on start: another process's first batch failed the audit; its message names the token"
            )

    # ---------------------------------------------------------------- the audit's trainer side

    def audit_first_forward(
        self, tensors: TrajectoryBatch, micros: list, off_policy: torch.Tensor | None = None
    ) -> None:
        """Give the audit on start the trainer's log-probs of the run's first trained update, whose
        forwards ran the weights that sampled the batch (each micro-batch's `logprobs`, kept by its
        loss), beside the sampler's record, over the tokens the policy sampled (`off_policy` (R_local,):
        rows guidance added, which nobody sampled). Nothing once the audit has its numbers."""
        if self.start_audit is None or not self.start_audit.episodes_checked:
            return
        for micro in micros:
            if micro.dummy:  # DDP padding repeats a row this rank already recorded
                continue
            index, length = torch.tensor(micro.rows, dtype=torch.long), micro.logprobs.shape[1]
            mask = tensors.loss_mask[index, :length]  # (b, t)
            if off_policy is not None:
                mask = mask * (~off_policy[index])[:, None].to(mask.dtype)
            device = micro.logprobs.device
            self.start_audit.record_logprobs(
                micro.logprobs, tensors.logprobs[index, :length].to(device), mask.to(device)
            )

    # ---------------------------------------------------------------- scoring

    @torch.no_grad()
    def score(self, tensors, reference: bool) -> torch.Tensor:
        """(R_local, T) log-probs under π_ref (reference=True) or the current weights, in micro-batches.

        They run in the precision the loss runs in (the loop's autocast, e.g. bf16): π_old
        recomputed in fp32 against a bf16 π_θ would put the precision gap into every ratio, so
        the first of μ updates would not start at ratio 1 and the clip would act on rounding."""
        temperature = self.cfg.rollout.sampling.temperature
        out = torch.zeros_like(tensors.logprobs)
        step = self.cfg.micro_batch_size
        for start in range(0, tensors.input_ids.shape[0], step):
            rows = slice(start, start + step)
            args = (
                tensors.input_ids[rows].to(self.accelerator.device),
                tensors.attention_mask[rows].to(self.accelerator.device),
                tensors.loss_mask[rows].to(self.accelerator.device),
            )
            with self.accelerator.autocast():
                if reference and self.reference is not None:
                    logps, _ = sequence_logprobs(self.reference, *args, temperature=temperature)
                elif reference:
                    with self.policy.disable_adapter():  # π_ref = the base model: no second copy in memory
                        logps, _ = sequence_logprobs(self.policy, *args, temperature=temperature)
                else:
                    logps, _ = sequence_logprobs(self.policy, *args, temperature=temperature)
            out[rows] = logps.float().cpu()
        return out

    def _batch_metrics(
        self, trajs: list[Trajectory], global_rewards: torch.Tensor, rollout_seconds: float
    ) -> dict[str, float]:
        """Rollout statistics over the whole batch: under DDP every rank gathers every episode's
        numbers, so each rank logs the same values as one process would."""
        names = list(trajs[0].reward_components) if trajs else []
        stats = ["correct", "policy_tokens", "turns", "tool_calls", "tool_errors", "failed"]
        local = torch.tensor(
            [
                [t.reward_components[n] for n in names]
                + [
                    float(bool(t.info.get("correct"))),
                    float(t.num_policy_tokens),
                    float(t.num_turns),
                    float(t.info.get("tool_calls", 0)),
                    float(t.info.get("tool_errors", 0)),
                    float(t.finish_reason == "error"),
                ]
                for t in trajs
            ],
            dtype=torch.float64,
        ).reshape(len(trajs), len(names) + len(stats))  # (B_local, K)
        table = gather_in_global_order(self.accelerator, local)  # (B, K)
        column = {key: table[:, i] for i, key in enumerate([*names, *stats])}
        reasons = gather_objects(self.accelerator, [t.finish_reason for t in trajs])  # (B,)
        metrics: dict[str, float] = {
            "reward/total/mean": float(global_rewards.mean()),
            "reward/total/std": float(global_rewards.std()) if global_rewards.numel() > 1 else 0.0,
        }
        for name in names:
            metrics[f"reward/{name}/mean"] = float(column[name].mean())
            metrics[f"reward/{name}/std"] = float(column[name].std()) if column[name].numel() > 1 else 0.0
        episodes = max(1, table.shape[0])
        metrics.update(
            {
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
            }
        )
        for reason in sorted(set(reasons)):
            metrics[f"rollout/finish/{reason}"] = reasons.count(reason) / len(reasons)
        cut = reasons.count("max_episode_tokens") / max(1, len(reasons))
        if cut >= 0.5:  # such an episode ends before it can succeed: the reward measures the limit
            self.accelerator.print(
                f"WARNING: {cut:.0%} of this batch's episodes ended at rollout.max_episode_tokens "
                f"({self.cfg.rollout.max_episode_tokens} tokens, prompt included) before they could finish; raise it "
                "(rollout/finish/max_episode_tokens in metrics.jsonl)",
                flush=True,
            )
        rank = f"[rank {self.accelerator.process_index}] " if self.accelerator.num_processes > 1 else ""
        for traj in trajs:  # every rank reports its own failed episodes
            if traj.finish_reason == "error":
                print(f"{rank}episode failed (task {traj.task_id}): {traj.info.get('error')}", flush=True)
        if table.shape[0] and float(column["failed"].sum()) == table.shape[0]:  # the same on every rank: all stop
            raise RunStopped(
                f"every episode of this batch failed ({table.shape[0]} of {table.shape[0]}, each printed above with its "
                "error): the env or its tools raise, so there is nothing to learn from. Check the env with "
                f"`agentic-rl envs oracle {self.cfg.env.name}` and `agentic-rl eval`, which show the error of each failure"
            )
        return metrics

    # ---------------------------------------------------------------- after each optimizer step

    def sync_weights(self) -> dict[str, float]:
        """Sync the rollout weights to the ones the optimizer just stepped: the engine stamps the new
        version on the episodes it samples next."""
        return {"rollout/weights_version": float(self.engine.sync_weights())}

    def finish_audit(self) -> dict[str, float]:
        """After the run's first trained update: the audit's log-prob drift over every process, and
        its verdict (printed); {} at every other step."""
        if self.start_audit is None or not self.start_audit.logprobs_measured:
            return {}
        metrics = self.start_audit.finish(lambda *drift: combine_drift(self.accelerator, *drift))
        self.start_audit = None
        return metrics

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
