"""What every trainer shares: the accelerator for the launch context, and seeding.

Models (the `model:` section, loading with LoRA, the `final/` format) live in models/.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.state import PartialState
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, FullyShardedDataParallelPlugin

from agentic_rl.models.precision import resolve_mixed_precision


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_accelerator(mixed_precision: str = "no", seed: int = 0):
    """An Accelerator for the launch context (single process, torchrun DDP, DeepSpeed, FSDP).

    configs/accelerate/ holds the FSDP and DeepSpeed ZeRO-2/3 launch configs (README, "GPUs and several processes")."""
    # LoRA leaves frozen parameters with no gradient; DDP must not wait for them.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=False)
    # Under torchrun on a machine without a GPU, accelerate only sets up gloo DDP when told it
    # runs on CPU; otherwise every rank silently trains alone and they race on output_dir.
    launched_world = int(os.environ.get("WORLD_SIZE", "1"))
    cpu_only = launched_world > 1 and not torch.cuda.is_available()
    resolved = resolve_mixed_precision(mixed_precision)
    if resolved != mixed_precision:
        print(
            f"train.mixed_precision: {mixed_precision} -> {resolved} on this machine (models/precision.py)", flush=True
        )
    accelerator = Accelerator(mixed_precision=resolved, kwargs_handlers=[ddp], cpu=cpu_only)
    if cpu_only and _fsdp_requested():
        _shard_on_cpu(accelerator)
    if accelerator.num_processes != launched_world:
        raise RuntimeError(
            f"launched with WORLD_SIZE={launched_world} but accelerate runs {accelerator.num_processes} "
            "process(es); check the launcher / accelerate config"
        )
    seed_everything(seed)
    return accelerator


def _fsdp_requested() -> bool:
    """What `accelerate launch --config_file configs/accelerate/fsdp.yaml` (or `--use_fsdp`) sets."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")


def _shard_on_cpu(accelerator) -> None:
    """Honour an FSDP launch on CPU processes (gloo), which accelerate 1.15 silently runs as DDP.

    accelerate only turns on FSDP for GPU-like process groups; on CPU it keeps its own plugin
    aside and replicates the model. The tests (tests/test_fsdp.py) and anyone trying an FSDP
    config on a laptop would then get DDP without a word. Here the launch state becomes FSDP,
    with the plugin accelerate reads from the same environment, before anything is prepared, so
    `prepare`, `clip_grad_norm_`, `save_state` and `get_state_dict` take their FSDP paths.
    Only FSDP2 (`fully_shard`) runs on CPU: FSDP1 wants a GPU `device_id`.
    """
    plugin = FullyShardedDataParallelPlugin()  # from the FSDP_* variables the launcher set
    if plugin.fsdp_version != 2:
        raise ValueError(
            f"FSDP on CPU processes needs fsdp_version: 2 (FSDP_VERSION={plugin.fsdp_version} was "
            "launched); set fsdp_version: 2 in the accelerate config (configs/accelerate/fsdp.yaml does)"
        )
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    # accelerate copies the process-wide state from PartialState each time it builds an
    # AcceleratorState, so both must say FSDP.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin


def fit_deepspeed_to_loop(accelerator, optim) -> None:
    """Under DeepSpeed, set the engine's settings that belong to the loop, before `prepare`.

    - gradient_accumulation_steps = 1: the loop accumulates its own micro-batches (their count
      varies per step) and marks the last one as the boundary, where the engine steps once.
    - gradient_clipping = optim.max_grad_norm: the engine clips, so our clip is its setting.
    - train_micro_batch_size_per_gpu = 1 where "auto": DeepSpeed needs a number, and uses it only
      for its throughput log (the loop passes accelerate no dataloader to infer it from).

    A value the accelerate config sets to something else is a ValueError: it would be ignored.
    `optim` is the command's OptimConfig; anything but DeepSpeed is left alone.
    """
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    wanted = {"gradient_accumulation_steps": 1, "gradient_clipping": float(optim.max_grad_norm)}
    for key, value in wanted.items():
        given = config.get(key, "auto")
        if given != "auto" and float(given) != value:
            raise ValueError(
                f"the DeepSpeed config sets {key}: {given}, but the loop needs {value} "
                f"({'set optim.max_grad_norm instead' if key == 'gradient_clipping' else 'set batch sizes in the command config instead'}); "
                "remove it from the accelerate/DeepSpeed config"
            )
        config[key] = value
    if config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        config["train_micro_batch_size_per_gpu"] = 1
    if config.get("train_batch_size", "auto") == "auto":
        config["train_batch_size"] = config["train_micro_batch_size_per_gpu"] * accelerator.num_processes
