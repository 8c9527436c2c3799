"""The model a trainer trains: its config section (`model:`) and loading it with LoRA applied."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from agentic_rl.config import Config
from agentic_rl.models.lora import LoraConfig, apply_lora, describe_trainable
from agentic_rl.models.stage_output import load_base_and_tokenizer


@dataclasses.dataclass
class ModelConfig(Config):
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


def load_policy(cfg: ModelConfig, device: Any = "cpu", log=print):
    """(policy, tokenizer, start): the model with LoRA applied per cfg, ready to train.

    `start` is cfg.name, the model the new adapters sit on; `save_final` records it, so the
    adapters are later applied to exactly these weights (for GRPO after SFT: the SFT model).
    """
    model, tokenizer, _ = load_base_and_tokenizer(cfg.name, cfg.dtype, device)
    base_name = cfg.name
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return make_trainable(model, cfg, log=log), tokenizer, base_name


def context_length(model: Any) -> int | None:
    """The longest sequence the model was built for (its config's max_position_embeddings), or None
    when the config does not say. A PEFT wrapper forwards `config` to the base model."""
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def make_trainable(model: Any, cfg: ModelConfig, task_type: str = "CAUSAL_LM", log=print):
    """`model` ready to train per cfg: gradient checkpointing if asked, then LoRA adapters (or every
    weight trainable when cfg.lora.enabled is false); logs what trains."""
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    trainable = apply_lora(model, cfg.lora, task_type=task_type)
    if not cfg.lora.enabled:
        trainable.requires_grad_(True)
    log(describe_trainable(trainable))
    return trainable
