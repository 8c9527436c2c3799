"""Where a model decodes: the one resolution of the `rollout.device` setting, and the one loader of
every command that decodes or scores outside the training loop (eval, chat, audit, serve, the
pipeline's evals, the reward model's sampled pairs, the TRL backend's saved base).

    resolve_device("auto")     # cuda when torch.cuda.is_available(), else cpu
    resolve_device("cuda:1")   # that GPU; an error naming the setting when it is not there
    model, tokenizer, base = load_for_decoding("runs/demo/sft/final", cfg.rollout.device)

The weights load in float32 (WEIGHTS_DTYPE), the precision the trainers score in, on the resolved
device; the decode precision is `rollout.dtype` on top of them, whose auto rule
(models/precision.py) build_runner applies to the device the weights sit on: bf16 copies on a
bf16 GPU or an AVX512/AMX CPU, float32 elsewhere. The trainers do not come here: accelerate puts
their model on its device.
"""

from __future__ import annotations

from typing import Any

import torch

from agentic_rl.config import DEVICE
from agentic_rl.models.stage_output import load_base_and_tokenizer

WEIGHTS_DTYPE = "float32"
"""The precision decoding commands load weights in: the trainers', so audit and RM log-probs
compare like with like and the hf backend (float32 only) runs; rollout.dtype picks the decode copy."""


def resolve_device(setting: str, key: str = "rollout.device") -> torch.device:
    """The torch.device of an `auto | cpu | cuda | cuda:N` setting; ValueError naming `key` for a
    malformed value or a GPU torch does not see (before any model is loaded)."""
    if not DEVICE.holds(setting):
        raise ValueError(f"{key} must be {DEVICE.shown}, got {setting!r}")
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{key}: device '{setting}' but torch sees no CUDA device (torch.cuda.is_available() "
                "is False); set device: cpu or auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{key}: device '{setting}' but torch sees {torch.cuda.device_count()} CUDA device(s) "
                f"(cuda:0..cuda:{torch.cuda.device_count() - 1}); pick one of them, or set device: auto"
            )
    return device


def load_for_decoding(name: str, device_setting: str, key: str = "rollout.device") -> tuple[Any, Any, str]:
    """(model, tokenizer, base_name) of `name` (any model source, a stage's final/ folder included)
    in WEIGHTS_DTYPE on the device `device_setting` resolves to."""
    device = resolve_device(device_setting, key)
    return load_base_and_tokenizer(name, WEIGHTS_DTYPE, device)
