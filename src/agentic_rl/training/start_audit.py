"""The audit every GRPO and PPO run does on its first batch (docs/design.md "Seams", audit on start;
`audit.on_start`, on by default): the checks of `agentic-rl audit`, on the batch's own episodes,
with no extra rollout and no extra forward pass.

    first batch ──► prefix + mask checks (before any gradient) ──► AuditFailed, or on
                ──► the first update's own forward: |log π_θ − log π_sampler| per trained token
                ──► after that step: the drift and the audit's seconds logged, one line printed

  prefix   each token sequence's conversation, rendered one turn further, keeps its earlier
           rendering as an exact token prefix (rollout/episode_checks.py `prefix_problem`, the
           template check of `agentic-rl audit`). The model's own words are rendered as the
           placeholders the engine renders them as when it derives an observation: the engine
           never re-renders them (Qwen3's template drops earlier `<think>` blocks, which is no
           bug of the run), so what is checked is exactly what the episode's tokens rely on. The
           last sequence of an episode whose history is not a prefix is skipped: its rendered
           context is not kept on the Trajectory (its earlier sequences are checked).
  mask     the loss mask is exactly the model's turns (`mask_problem`); failed episodes, never
           trained, are skipped.
  logprobs at the first update of the first trained batch, π_θ IS the sampling weights, so the
           loss's own forward gives the trainer's log-probs for free; the drift from the
           sampler's record is logged (rollout/logprob_drift_max, _mean). With float32 on both
           sides it must stay within FLOAT32_LOGPROB_TOLERANCE (else a warning: a kernel or
           weight-sync bug); with bf16 on a side it is the mismatch rollout_correction corrects.

A prefix or mask failure stops the run (`AuditFailed`, a RunStopped: `agentic-rl` prints it and
exits 3) before the first gradient, naming the episode, the token sequence, the first bad token
and the tokens around it. Under DDP every rank checks its own episodes and all ranks stop together.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from agentic_rl.errors import RunStopped
from agentic_rl.models.chat_format import ChatFormat, with_placeholder_assistants
from agentic_rl.models.precision import decoded_dtype
from agentic_rl.rollout.config import FLOAT32_LOGPROB_TOLERANCE
from agentic_rl.rollout.episode_checks import (
    logprob_drift,
    mask_problem,
    mask_table,
    prefix_problem,
    token_table,
    turn_cuts,
)
from agentic_rl.rollout.trajectory import Trajectory
from agentic_rl.training.gather import combine_drift, sum_over_processes


class AuditFailed(RunStopped):
    """The first batch's episodes break a training invariant; the message names the first bad token."""


_HOW_TO_SKIP = "(audit.on_start: false skips this check; the run would then train on these tokens)"


class StartAudit:
    """The audit of one run's first batch (module docstring). `check_episodes` once, then
    `record_logprobs` at each micro-batch of the first update, then `finish` after that step."""

    def __init__(
        self,
        chat_format: ChatFormat,
        tools: Sequence[dict[str, Any]] | None,
        float32_both_sides: bool,
        log: Callable[[str], None] = print,
    ):
        self.chat_format, self.tools, self.log = chat_format, tools, log
        self.tolerance = (
            FLOAT32_LOGPROB_TOLERANCE if float32_both_sides else None
        )  # None: bf16 on a side, reported only
        self.episodes_checked = False
        self.seconds = 0.0
        self._drift_max, self._drift_sum, self._drift_count = 0.0, 0.0, 0
        self._recorded = False  # set on every process at the same update, tokens or not (collectives follow it)

    # ------------------------------------------------------------------ before the first gradient

    def check_episodes(self, trajectories: Sequence[Trajectory]) -> str | None:
        """Prefix and mask checks of this process's episodes; the failure message, or None (all pass).
        The caller raises (after agreeing with the other processes)."""
        started = time.perf_counter()
        failure, boundaries, turns = None, 0, 0
        for trajectory in trajectories:
            if trajectory.finish_reason == "error":
                continue  # its loss mask is zeroed: never trained
            failure = self._prefix_failure(trajectory) or self._mask_failure(trajectory)
            if failure is not None:
                break
            for sequence, prompt in self._rendered_sequences(trajectory):
                boundaries += len(turn_cuts(sequence.messages, prompt)) - 1
            turns += trajectory.num_turns
        self.seconds += time.perf_counter() - started
        self.episodes_checked = True
        if failure is None:
            self.log(
                f"audit on start: PASS prefix ({boundaries} turn boundaries), PASS mask ({turns} model turns of "
                f"{len(trajectories)} episodes) in {self.seconds:.3f} s"
            )
        return failure

    def _rendered_sequences(self, trajectory: Trajectory) -> list[tuple[Trajectory, int]]:
        """(token sequence, its context's message count) for each sequence whose rendered
        conversation the trajectory keeps: every one of a prefix episode, the earlier ones of a
        non-prefix episode (the last one's `messages` is the whole episode, not what it rendered)."""
        sequences = trajectory.sequences() if not trajectory.previous else trajectory.previous
        out = []
        for sequence in sequences:
            assistant = [i for i, m in enumerate(sequence.messages) if m["role"] == "assistant"]
            own = len(sequence.policy_spans)  # its own turns are its last `own` assistant messages
            out.append((sequence, assistant[len(assistant) - own] if own else len(sequence.messages)))
        return out

    def _prefix_failure(self, trajectory: Trajectory) -> str | None:
        for number, (sequence, prompt) in enumerate(self._rendered_sequences(trajectory)):
            messages = with_placeholder_assistants(sequence.messages)
            problem = prefix_problem(self.chat_format, messages, prompt, self.tools)
            if problem is not None:
                table = token_table(self.chat_format, problem.shorter, problem.longer, problem.position)
                return (
                    f"audit on start: FAIL prefix: task {trajectory.task_id}, token sequence {number}: rendering "
                    f"{problem.after} messages rewrites the rendering of the first {problem.before}; first "
                    f"differing token at position {problem.position} {_HOW_TO_SKIP}\n" + "\n".join(table)
                )
        return None

    def _mask_failure(self, trajectory: Trajectory) -> str | None:
        problem = mask_problem(self.chat_format, trajectory)
        if problem is None:
            return None
        number, position, message = problem
        table = mask_table(self.chat_format, trajectory.sequences()[number], position)
        return (
            f"audit on start: FAIL mask: task {trajectory.task_id}, token sequence {number}: {message} "
            f"{_HOW_TO_SKIP}\n" + "\n".join(table)
        )

    # ------------------------------------------------------------------ during the first update

    def record_logprobs(self, trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor) -> None:
        """Add one micro-batch's (b, T) log-probs of the weights that sampled it (the first update's
        forward) and the sampler's record, over its trained tokens (mask 1)."""
        started = time.perf_counter()
        self._recorded = True
        drift = logprob_drift(trainer_logps, sampler_logps, mask)  # (N,)
        if drift.numel():
            self._drift_max = max(self._drift_max, float(drift.max()))
            self._drift_sum += float(drift.sum())
            self._drift_count += drift.numel()
        self.seconds += time.perf_counter() - started

    @property
    def logprobs_measured(self) -> bool:
        return self._recorded

    def finish(
        self, combine: Callable[[float, int, float], tuple[float, int, float]] | None = None
    ) -> dict[str, float]:
        """The drift and cost metrics, after the step whose forward passes were recorded; prints the verdict.
        combine: (sum, count, max) of this process -> those of all processes, so every rank logs the
        whole batch's drift (as every other rollout metric) rather than its own half's."""
        if combine is not None:
            self._drift_sum, self._drift_count, self._drift_max = combine(
                self._drift_sum, self._drift_count, self._drift_max
            )
        mean = self._drift_sum / max(1, self._drift_count)
        if self.tolerance is None:
            verdict = "bf16 on a side: this is the sampler/trainer mismatch (rollout_correction)"
        elif self._drift_max <= self.tolerance:
            verdict = f"PASS, within the float32 tolerance {self.tolerance:g}"
        else:
            verdict = (
                f"WARNING: above the float32 tolerance {self.tolerance:g}: the sampler and the trainer run the "
                "same precision, so their log-probs should agree to rounding (a decode kernel or weight-sync "
                "bug? `agentic-rl audit` shows more)"
            )
        self.log(
            f"audit on start: logprobs max |sampler − trainer| {self._drift_max:.2e}, mean {mean:.2e} over "
            f"{self._drift_count} trained tokens ({verdict}); the audit took {self.seconds:.3f} s"
        )
        return {
            "rollout/logprob_drift_max": self._drift_max,
            "rollout/logprob_drift_mean": mean,
            "time/audit": self.seconds,
        }


class RunAudit:
    """One on-policy run's audit on start across its processes: `check_first_batch` on the first
    batch's episodes, `record_first_forward` after the first update that trained on them, then
    `finish`. Off (`audit.on_start: false`) or done, each call does nothing."""

    def __init__(self, audit: StartAudit | None, accelerator: Any):
        self.audit, self.accelerator = audit, accelerator

    @classmethod
    def for_run(cls, cfg: Any, sampler: Any, accelerator: Any) -> RunAudit:
        """The run's audit (`cfg.audit.on_start`) of what `sampler` (training/sampler.py, bound) rolls
        out, with the float32 tolerance when the sampler and the trainer both run float32 (else the
        drift is the mismatch, reported only)."""
        if not cfg.audit.on_start:
            return cls(None, accelerator)

        decodes = decoded_dtype(cfg.rollout.dtype, accelerator.device)
        float32 = decodes == "float32" and cfg.model.dtype == "float32" and accelerator.mixed_precision == "no"
        tools = sampler.env_for(sampler.task_pool[0]).tool_schemas
        return cls(StartAudit(sampler.engine.chat_format, tools, float32, log=accelerator.print), accelerator)

    @property
    def done(self) -> bool:
        return self.audit is None

    def check_first_batch(self, trajectories: Sequence[Trajectory]) -> None:
        """The prefix and mask checks of the run's first batch, before any gradient; every process
        stops if any one's episodes fail (a rank alone would leave the others waiting)."""
        if self.audit is None or self.audit.episodes_checked:
            return
        failure = self.audit.check_episodes(trajectories)
        failed_somewhere = sum_over_processes(self.accelerator, float(failure is not None))
        if failure is not None:
            raise AuditFailed(failure)
        if failed_somewhere:
            raise AuditFailed(
                "audit on start: another process's first batch failed the audit; its message names the token"
            )

    def record_first_forward(self, tensors: Any, micros: Sequence[Any], off_policy: torch.Tensor | None = None) -> None:
        """The trainer's side, after the first update that trained on the checked batch, whose
        forwards ran the weights that sampled it: each micro-batch's `logprobs` (kept by its loss)
        against the sampler's record, over the tokens the policy sampled (`off_policy` (R,): the
        rows guidance added, which nobody sampled)."""
        if self.audit is None or not self.audit.episodes_checked:
            return
        for micro in micros:
            if micro.dummy:  # DDP padding repeats a row this rank already recorded
                continue
            index, length = torch.tensor(micro.rows, dtype=torch.long), micro.logprobs.shape[1]
            mask = tensors.loss_mask[index, :length]  # (b, t)
            if off_policy is not None:
                mask = mask * (~off_policy[index])[:, None].to(mask.dtype)
            device = micro.logprobs.device
            self.audit.record_logprobs(micro.logprobs, tensors.logprobs[index, :length].to(device), mask.to(device))

    def finish(self) -> dict[str, float]:
        """After the update whose forwards were recorded: the drift over every process and the
        verdict (printed); then the audit is done. {} at every other step."""
        if self.audit is None or not self.audit.logprobs_measured:
            return {}
        metrics = self.audit.finish(lambda *drift: combine_drift(self.accelerator, *drift))
        self.audit = None
        return metrics
