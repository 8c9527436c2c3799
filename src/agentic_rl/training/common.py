"""What every trainer shares: the model section of a config, loading with LoRA, the accelerator,
and saving the final model (adapters for LoRA, a full directory otherwise).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from agentic_rl.models.lora import LoraConfig, apply_lora, describe_trainable
from agentic_rl.strict_json import write_json

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FINAL_DIR = "final"
_SOURCE_FILE = "agentic_rl_model.json"


@dataclasses.dataclass
class ModelConfig:
    """Which model to train and how."""

    name: str = "smollm2-135m-instruct"
    """A built-in name (smollm2-135m-instruct, tiny-qwen3), a local HF directory, a hub id, or a
    previous stage's output (a `final/` folder with LoRA adapters or a full model)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype. float32 on CPU; bfloat16 on GPUs that support it."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """LoRA adapters (lora.enabled: false trains every weight)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory (slower)."""


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


def load_base_and_tokenizer(name: str, dtype: str, device: Any = "cpu"):
    """(model, tokenizer, base_name): follows a previous stage's `final/` folder back to its base.

    A LoRA `final/` folder is loaded as base + adapters and merged, so the next stage starts
    from the trained weights with fresh adapters (the standard SFT -> RL hand-off).
    """
    from agentic_rl.models import load_model

    source = Path(name) / _SOURCE_FILE
    if source.exists():
        record = json.loads(source.read_text())
        if record["kind"] == "lora":
            from peft import PeftModel

            # "base" is the model these adapters were trained on, itself possibly a stage's
            # final/ folder (SFT -> GRPO): resolve the chain down to real weights.
            base, tokenizer, root = load_base_and_tokenizer(record["base"], dtype, device)
            merged = PeftModel.from_pretrained(base, name).merge_and_unload()
            return merged, tokenizer, root
        return (*load_model(name, dtype=_DTYPES[dtype], device=device), record["base"])
    model, tokenizer = load_model(name, dtype=_DTYPES[dtype], device=device)
    return model, tokenizer, name


def load_policy(cfg: ModelConfig, device: Any = "cpu", log=print):
    """(policy, tokenizer, start): the model with LoRA applied per cfg, ready to train.

    `start` is cfg.name, the model the new adapters sit on; `save_final` records it, so the
    adapters are later applied to exactly these weights (for GRPO after SFT: the SFT model).
    """
    model, tokenizer, _ = load_base_and_tokenizer(cfg.name, cfg.dtype, device)
    base_name = cfg.name
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    policy = apply_lora(model, cfg.lora)
    if not cfg.lora.enabled:
        policy.requires_grad_(True)
    log(describe_trainable(policy))
    return policy, tokenizer, base_name


def save_final(model: torch.nn.Module, tokenizer: Any, folder: Path, base_name: str, accelerator: Any) -> Path:
    """Write `folder/final`: LoRA adapters (small) or the full model, plus the tokenizer."""
    target = Path(folder) / FINAL_DIR
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(target)
        tokenizer.save_pretrained(target)
        kind = "lora" if hasattr(unwrapped, "peft_config") else "full"
        write_json(target / _SOURCE_FILE, {"kind": kind, "base": base_name})
    accelerator.wait_for_everyone()
    return target


def merge_adapters(adapters: str | Path, out: str | Path) -> Path:
    """Write a standalone HF model directory (base + adapters merged) that transformers and vLLM load."""
    model, tokenizer, base = load_base_and_tokenizer(str(adapters), "float32")
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def shard_for_rank(items: list, accelerator: Any) -> list:
    """This rank's share of a global list: rows [rank, rank + world, ...]. Lengths must divide."""
    world = accelerator.num_processes
    if len(items) % world:
        raise ValueError(f"{len(items)} items cannot be split evenly over {world} processes; make the batch a multiple of {world}")
    return items[accelerator.process_index :: world]
