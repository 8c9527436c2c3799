"""The one training loop, on accelerate. SFT, the reward model, GRPO and PPO all run through it.

An algorithm is an `Objective` whose `step(trainer, step)` makes the step's data (rollouts,
demonstrations or preference pairs), hands its micro-batch losses to `Trainer.accumulate` and
then calls `Trainer.optimizer_step`. The loop and the Trainer own everything else: the
optimizer and schedule, gradient accumulation, clipping, mixed precision, distribution (DDP /
DeepSpeed / FSDP, all through accelerate), finite checks, atomic checkpoints, exact resume,
metrics and the progress bar.

Gradient accumulation, per optimizer step:

    batch ──split──► micro_0   micro_1   ...   micro_{m-1}
                     fwd+bwd   fwd+bwd         fwd+bwd       (no_sync on all but the last:
                     └─────── grads sum in .grad ────────┘    DDP all-reduces once)
                     Trainer.accumulate                      clip ─► AdamW ─► schedule
                                                             Trainer.optimizer_step

Finite or fail (docs/design.md invariant 8): every micro-batch loss and the global gradient norm
are checked before the optimizer steps, and the trainable weights after it. A NaN or inf
stops the run with `NonFiniteError` naming the step and the quantity; no checkpoint is written
after it, so the newest checkpoint on disk (if any) is the last finite state to resume from.
Rewards are covered through the loss: a NaN reward makes the advantages, hence the loss, NaN.

Each micro-batch loss is already scaled to its share of the full-batch loss (the objective
knows the global normaliser: sequences or tokens, across ranks), so the summed gradient is
exactly the full-batch gradient, whatever the micro-batch size.

    python -c "from agentic_rl.training.loop import run_training"   # called by the trainers
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Callable, Literal, Protocol, Sequence

import torch
from tqdm.auto import tqdm
from transformers import get_scheduler

from agentic_rl.config import Config, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from agentic_rl.errors import RunStopped
from agentic_rl.models.finite import NORM_OVERFLOW, first_non_finite
from agentic_rl.training.checkpoint import latest_checkpoint
from agentic_rl.training.common import fit_deepspeed_to_loop
from agentic_rl.training.run_dir import RunDir


@dataclasses.dataclass
class OptimConfig(Config):
    """AdamW, learning-rate schedule and gradient clipping."""

    lr: PositiveFloat = 1e-5
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: PositiveFloat = 1e-8
    """AdamW epsilon."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    warmup_steps: NonNegativeInt = 0
    """Optimizer steps of linear warm-up from 0 to lr."""
    max_grad_norm: NonNegativeFloat = 1.0
    """Clip the global gradient norm to this value (0 disables clipping)."""

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")


@dataclasses.dataclass
class LoopConfig(Config):
    """How long to train, where to write, and how often to save."""

    steps: NonNegativeInt = 100
    """Optimizer steps."""
    seed: int = 0
    """Seed for initialisation, data order and sampling."""
    output_dir: str = "runs/train"
    """Run directory (run.json, config.yaml, metrics.jsonl, tb/, checkpoints/, final/); created if
    missing, `~` expanded. Empty, a file, or a path that cannot be created is an error. A folder
    holds one run at a time (a second launch into it is refused while the first runs): see
    `resume` for what a rerun into it does."""
    checkpoint_every: NonNegativeInt = 0
    """Save a checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: PositiveInt = 2
    """How many recent checkpoints to keep."""
    resume: bool = True
    """true: continue the run in output_dir from its newest intact checkpoint, if any. Only the
    same command with the same config may continue it: any other key that differs (all but
    train.steps, progress, log_every, checkpoint_every, keep_checkpoints and output_dir) stops the
    rerun before any work, naming each key with both values; so does a checkpoint past
    train.steps or one with non-finite weights. A finished run with the same config says so and
    is not run again; a larger train.steps trains on. false: delete the folder's previous run
    (run.json, config.yaml, metrics.jsonl, tb/, checkpoints/, final/) and start over.
    (training/run_dir.py)"""
    mixed_precision: Literal["no", "bf16", "auto"] = "no"
    """Autocast precision for forward/backward. bf16 needs hardware support to pay off (a CPU
    with bf16 kernels, AVX512 or AMX, or a bf16 GPU; on AVX2-only CPUs a bf16 step is many times
    slower). auto: bf16 where it is fast, else no (models/precision.py); the run logs which."""
    log_every: PositiveInt = 1
    """Log metrics every N steps."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if not self.output_dir.strip():
            raise ValueError(
                "train.output_dir is empty; set it to a folder for this run (e.g. runs/sft): an empty path "
                "would write the run into the current directory"
            )
        self.output_dir = os.path.expanduser(self.output_dir)  # `~/runs/x`, not a folder named `~` in the cwd


class NonFiniteError(RunStopped):
    """A loss, gradient norm or weight became NaN/inf; the message names the step and quantity."""


class Objective(Protocol):
    """What an algorithm gives the loop: its step, and what resume needs.

    GRPO and PPO write their own `step` (training/grpo.py, training/ppo.py: one function each that
    reads in the order it runs); SFT and the reward model inherit `BatchObjective.step`."""

    def bind(self, model: torch.nn.Module, accelerator: Any) -> None:
        """Receive the prepared (possibly DDP-wrapped) model and the accelerator."""

    def step(self, trainer: "Trainer", step: int) -> dict[str, float]:
        """Optimizer step `step`: make the data (a function of (seed, step, own state) only),
        `trainer.accumulate` the micro-batch losses, `trainer.optimizer_step`; the step's metrics."""

    def state_dict(self) -> dict[str, Any]:
        """What resume needs beyond model/optimizer/RNG (data position, cached batches)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BatchObjective:
    """An objective whose batches are a pure function of (seed, step) (SFT, reward model): it
    gives `next_batch`, `micro_batches` and `loss`; the step is always the same four lines, and
    there is nothing to do after it or to checkpoint beyond model, optimizer and RNG."""

    def next_batch(self, step: int) -> Any:
        raise NotImplementedError

    def micro_batches(self, batch: Any) -> Sequence[Any]:
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, micro_batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the full-batch loss, and metrics (see Trainer.accumulate)."""
        raise NotImplementedError

    def step(self, trainer: "Trainer", step: int) -> dict[str, float]:
        started = time.perf_counter()
        batch = self.next_batch(step)
        data_seconds = time.perf_counter() - started
        metrics = trainer.accumulate(self.micro_batches(batch), lambda micro: self.loss(trainer.model, micro))
        started = time.perf_counter()
        metrics |= trainer.optimizer_step(step)
        return metrics | {"time/data": data_seconds, "time/optimizer": time.perf_counter() - started}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Trainer:
    """The prepared model and optimizer, and the two things every step does with them
    (the diagram in the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, scheduler: Any, optim: OptimConfig, accelerator: Any):
        self.model, self.optimizer, self.scheduler, self.optim, self.accelerator = (
            model,
            optimizer,
            scheduler,
            optim,
            accelerator,
        )
        self._bad_loss: tuple[int, float] | None = (
            None  # (micro-batch index, value) of the step's first non-finite loss
        )

    def accumulate(
        self, micro_batches: Sequence[Any], loss_of: Callable[[Any], tuple[torch.Tensor, dict[str, float]]]
    ) -> dict[str, float]:
        """Forward and backward each micro-batch (`loss_of(micro)`: its share of the full-batch
        loss, and metrics), summing gradients; returns the metrics averaged over the micro-batches
        (a key ending in `_max`: their largest value), `loss/total` and `time/forward_backward`.
        No micro-batch at all (nothing in the batch has a gradient): the step runs on zeros."""
        accelerator, model = self.accelerator, self.model
        metric_sums: dict[str, float] = {}
        loss_total = 0.0
        self._bad_loss = None
        started = time.perf_counter()
        for index, micro in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            sync = contextlib.nullcontext() if last else accelerator.no_sync(model)
            # The accumulation boundary: DeepSpeed's engine reduces and steps inside backward on it
            # (accelerate reads this flag there); DDP and FSDP are held back by no_sync instead.
            accelerator.gradient_state._set_sync_gradients(last)
            with sync, accelerator.autocast():
                loss, metrics = loss_of(micro)
                accelerator.backward(loss)
            loss_value = float(loss.detach())
            if self._bad_loss is None and not math.isfinite(loss_value):
                self._bad_loss = (index, loss_value)
            loss_total += loss_value
            for key, value in metrics.items():
                if key.endswith("_max"):  # a maximum stays one over micro-batches
                    metric_sums[key] = max(metric_sums.get(key, -math.inf), float(value))
                else:
                    metric_sums[key] = metric_sums.get(key, 0.0) + float(value)
        if not micro_batches:  # step on zeros, exactly as if computed
            for param in model.parameters():
                if param.requires_grad:
                    param.grad = torch.zeros_like(param)
        row = {
            key: value if key.endswith("_max") else value / max(1, len(micro_batches))
            for key, value in metric_sums.items()
        }
        return row | {"loss/total": loss_total, "time/forward_backward": time.perf_counter() - started}

    def optimizer_step(self, step: int) -> dict[str, float]:
        """Clip, check finite (the step's losses, the gradient norm; the weights after), AdamW,
        schedule; returns `optim/lr` and `optim/grad_norm`. Raises NonFiniteError (module docstring)."""
        accelerator, model, optim = self.accelerator, self.model, self.optim
        # max_norm=inf measures without clipping (the scale is clamped to 1), so the check always runs.
        max_norm = optim.max_grad_norm if optim.max_grad_norm > 0 else float("inf")
        grad_norm = float("nan")  # DeepSpeed reports no norm before its first step; it checks overflow itself
        norm = accelerator.clip_grad_norm_(model.parameters(), max_norm) if accelerator.sync_gradients else None
        # Raised only now, after backward and the norm (collectives under DDP/FSDP), so every rank
        # gets this far: a NaN loss on one rank makes the all-reduced gradients NaN on all of them.
        if self._bad_loss is not None:
            _require_finite(self._bad_loss[1], f"loss of micro-batch {self._bad_loss[0]}", step)
        if norm is not None:
            grad_norm = float(norm)
            _require_finite(grad_norm, "gradient norm", step)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        _require_finite_weights(model, step)
        return {"optim/lr": self.scheduler.get_last_lr()[0], "optim/grad_norm": grad_norm}


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    # A model may ask for its own learning rates per parameter group (PPO's value model); the
    # schedule scales every group alike, and optim/lr logs the first group's.
    groups = model.optimizer_groups(cfg.lr) if hasattr(model, "optimizer_groups") else [{"params": params}]
    grouped = [id(p) for group in groups for p in group["params"]]
    if len(grouped) != len(set(grouped)) or set(grouped) != {id(p) for p in params}:
        raise ValueError(f"{type(model).__name__}.optimizer_groups must hold every trainable parameter exactly once")
    # The fused kernel makes one pass over parameter, gradient and both moments: 4.6x faster than
    # the default multi-tensor path on SmolLM2-135M's 134.5 M parameters on 2 CPU cores
    # (benchmarks/optimizer_step.py); the two differ by float rounding only.
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused
    )
    scheduler = get_scheduler(
        cfg.schedule, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=max(total_steps, 1)
    )
    return optimizer, scheduler


def run_training(
    objective: Objective,
    model: torch.nn.Module,
    loop: LoopConfig,
    optim: OptimConfig,
    accelerator: Any,
    run_dir: RunDir,
    description: str = "train",
) -> list[dict[str, float]]:
    """Train `model` on `objective` for loop.steps optimizer steps; return the logged rows."""
    optimizer, scheduler = build_optimizer(model, optim, loop.steps)
    fit_deepspeed_to_loop(accelerator, optim)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    objective.bind(model, accelerator)
    trainer = Trainer(model, optimizer, scheduler, optim, accelerator)
    start = run_dir.resume(objective, model, loop, accelerator)
    history: list[dict[str, float]] = []
    bar = tqdm(
        range(start, loop.steps),
        desc=description,
        disable=not (loop.progress and accelerator.is_main_process),
        initial=start,
        total=loop.steps,
    )
    for step in bar:
        try:
            row = objective.step(trainer, step)
            if torch.cuda.is_available():
                row["memory/max_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
        except NonFiniteError as exc:
            resume = latest_checkpoint(run_dir.checkpoints)
            where = (
                f"the last finite checkpoint is {resume} (a rerun resumes from it)"
                if resume
                else "no checkpoint was written yet (a rerun starts over)"
            )
            raise NonFiniteError(
                f"{exc}. The run stopped; {where}. Lower optim.lr, "
                "check the rewards and data, or set optim.max_grad_norm."
            ) from None
        history.append(row)
        if (step + 1) % loop.log_every == 0 or step + 1 == loop.steps:
            run_dir.log(step + 1, row)
        bar.set_postfix({k: f"{row[k]:.3g}" for k in ("loss/total", "reward/total/mean") if k in row})
        if loop.checkpoint_every and (step + 1) % loop.checkpoint_every == 0 and step + 1 < loop.steps:
            run_dir.save(objective, accelerator, step + 1, loop.keep_checkpoints)
    if loop.steps > start:
        run_dir.save(objective, accelerator, loop.steps, loop.keep_checkpoints)
    return history


def _require_finite(value: float, quantity: str, step: int) -> None:
    if not math.isfinite(value):
        raise NonFiniteError(f"step {step + 1}: the {quantity} is {value} (not finite)")


def _require_finite_weights(model: torch.nn.Module, step: int) -> None:
    bad = first_non_finite(model)
    if bad is None:
        return
    if bad == NORM_OVERFLOW:  # finite, |w| ~ 1e19 in float32, but a diverged run all the same
        raise NonFiniteError(f"step {step + 1}: the weights' norm overflowed after the optimizer step")
    raise NonFiniteError(f"step {step + 1}: weight {bad!r} is not finite after the optimizer step")
