"""What every trainer shares: the accelerator for the launch context, and seeding.

Models (the `model:` section, loading with LoRA, the `final/` format) live in models/.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_accelerator(mixed_precision: str = "no", seed: int = 0):
    """An Accelerator for the launch context (single process, torchrun DDP, DeepSpeed, FSDP)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # LoRA leaves frozen parameters with no gradient; DDP must not wait for them.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=False)
    # Under torchrun on a machine without a GPU, accelerate only sets up gloo DDP when told it
    # runs on CPU; otherwise every rank silently trains alone and they race on output_dir.
    launched_world = int(os.environ.get("WORLD_SIZE", "1"))
    cpu_only = launched_world > 1 and not torch.cuda.is_available()
    accelerator = Accelerator(mixed_precision=mixed_precision, kwargs_handlers=[ddp], cpu=cpu_only)
    if accelerator.num_processes != launched_world:
        raise RuntimeError(f"launched with WORLD_SIZE={launched_world} but accelerate runs {accelerator.num_processes} "
                           "process(es); check the launcher / accelerate config")
    seed_everything(seed)
    return accelerator
