"""LoRA adapters through PEFT, with the checks PEFT leaves to the user.

The update of an adapted weight W (d_out × d_in) is ΔW = (α/r)·B·A with A: r × d_in and
B: d_out × r, so each adapted matrix trains r·(d_in + d_out) parameters instead of d_in·d_out.
`describe_trainable` prints both counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Iterator

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from transformers import PreTrainedModel

from agentic_rl.config import Config, FractionBelowOne, PositiveFloat, PositiveInt


@dataclasses.dataclass
class LoraConfig(Config):
    """LoRA settings. `enabled: false` means full fine-tuning."""

    enabled: bool = True
    """Train LoRA adapters (true) or every weight of the model (false)."""
    r: PositiveInt = 16
    """Adapter rank r."""
    alpha: PositiveFloat = 32.0
    """Scale numerator: the update is (alpha / r)·B·A."""
    dropout: FractionBelowOne = 0.0
    """Dropout on the adapter input during training."""
    target_modules: list[str] = dataclasses.field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names (last path component) of the linear layers to adapt."""

    def __post_init__(self) -> None:
        if self.enabled and not self.target_modules:
            raise ValueError("lora.target_modules is empty; name at least one linear layer, e.g. [q_proj, v_proj]")


def apply_lora(model: PreTrainedModel, cfg: LoraConfig, task_type: str = "CAUSAL_LM") -> torch.nn.Module:
    """Wrap `model` with LoRA adapters (or return it unchanged when cfg.enabled is false).

    Raises ValueError naming any target module the model lacks, with the names it does have.
    """
    if not cfg.enabled:
        return model
    linear_names = sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )
    missing = sorted(set(cfg.target_modules) - set(linear_names))
    if missing:
        raise ValueError(
            f"lora.target_modules {missing} not found in {type(model).__name__}; "
            f"its linear layers are named: {linear_names}"
        )
    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type=task_type,
        bias="none",
    )
    with quiet_peft():
        return get_peft_model(model, peft_cfg)


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """PEFT reads `model.is_gradient_checkpointing`, which transformers deprecates with a FutureWarning
    printed on every command that loads adapters: noise the user can do nothing about, hidden here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


def describe_trainable(model: torch.nn.Module) -> str:
    """One line: trainable / total parameters and the LoRA saving factor."""
    trainable, total = count_parameters(model)
    return f"trainable parameters: {trainable:,} of {total:,} ({100.0 * trainable / max(total, 1):.3f}%)"
