"""The command driver `agentic-rl grpo` and `ppo` share around their steps (training/grpo.py,
training/ppo.py): the accelerator, the run folder, the policy and π_ref, the training loop, and
`final/`. The algorithm's own step is what differs; this file holds none of it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import torch

from agentic_rl.models.policy import load_policy
from agentic_rl.models.stage_output import save_final
from agentic_rl.training.common import make_accelerator
from agentic_rl.training.loop import run_training
from agentic_rl.training.run_dir import start_run
from agentic_rl.training.scoring import require_replicated_weights, unwrap_policy


def train_on_policy(
    command: str, cfg: Any, build: Callable[[Any, Any, torch.nn.Module | None, Any], tuple[Any, torch.nn.Module]]
) -> dict[str, Any]:
    """What `agentic-rl grpo` and `ppo` share around their steps: the accelerator, the run
    folder (stops if it holds another run; returns a finished one's result), the policy and π_ref
    (a frozen copy for a full fine-tune with β > 0; LoRA disables its adapters instead), the loop,
    and `final/` (the policy only). `build(policy, tokenizer, reference, accelerator)` gives the
    algorithm (training/loop.py's Objective) and the module the loop trains."""
    cfg.reward_model.check_path()  # before anything loads (validation.py checks it at the command line)
    accelerator = make_accelerator(cfg.train.mixed_precision, cfg.train.seed)
    require_replicated_weights(accelerator, command)  # rollouts (and a reward head) read whole weights
    run_dir = start_run(command, cfg, accelerator)  # stops here if the folder holds another run
    if run_dir.finished is not None:
        return run_dir.finished
    policy, tokenizer, base_name = load_policy(cfg.model, accelerator.device, log=accelerator.print)
    reference = None
    if cfg.loss.needs_reference and not cfg.model.lora.enabled:
        reference = copy.deepcopy(policy).eval().requires_grad_(False)  # full fine-tune: a frozen copy is π_ref
    algorithm, model = build(policy, tokenizer, reference, accelerator)
    history = run_training(algorithm, model, cfg.train, cfg.optim, accelerator, run_dir, description=command)
    final = save_final(
        unwrap_policy(algorithm.model, accelerator), tokenizer, Path(cfg.train.output_dir), base_name, accelerator
    )
    result = {"final": str(final), "history": history}
    run_dir.finish(cfg.train.steps, result)
    run_dir.close()
    return result
