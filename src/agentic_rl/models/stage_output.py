"""The stage-output format: what a stage leaves in `final/`, and how any later stage loads it.

    folder/final/
        adapter_model.safetensors + adapter_config.json     (LoRA)  or  model.safetensors + config.json (full)
        tokenizer files
        agentic_rl_model.json        {"kind": "lora" | "full", "base": the model the weights sit on}

`base` may itself be a stage's `final/` folder (GRPO after SFT), so loading follows the chain
down to real weights and merges each level's adapters on the way up. A stage folder is recorded
relative to the record's own folder (`../../sft/final`), a plain local model folder as an absolute
path, a model name or hub id as given; so a record reads the same from any working directory, and a
copied or moved run tree follows its own chain. (Records from before this rule hold the path as
given on the command line, read against the working directory.) Every command that takes
a model name (eval, the trainers, merge, serve, chat) loads through `load_base_and_tokenizer`,
which refuses a stage output with a non-finite weight; trainers (ours and the TRL backend) write
the record through `write_stage_record`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel

from agentic_rl.errors import quoted
from agentic_rl.models import load_model
from agentic_rl.models.finite import NORM_OVERFLOW, first_non_finite
from agentic_rl.models.loader import BUILTIN_MODELS, load_tokenizer, unloadable_weights
from agentic_rl.models.lora import quiet_peft
from agentic_rl.strict_json import read_json, write_json

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FINAL_DIR = "final"
STAGE_RECORD = "agentic_rl_model.json"


def read_stage_record(folder: str | Path) -> dict[str, Any] | None:
    """`folder`'s stage record ({"kind", "base"}, a relative base resolved against `folder`), or None
    when it is not a stage's output. ValueError naming the file when the record is not valid JSON or
    lacks its two keys."""
    path = Path(folder) / STAGE_RECORD
    if not path.exists():
        return None
    fix = f"restore it, or delete it if '{folder}' is a plain Hugging Face model folder"
    record = read_json(path, fix)
    if not (
        isinstance(record, dict)
        and record.get("kind") in ("lora", "full")
        and isinstance(record.get("base"), str)
        and record["base"]
    ):
        raise ValueError(
            f'{path}: a stage record is {{"kind": "lora" | "full", "base": "<model>"}}, got {quoted(record)}; {fix}'
        )
    if record["base"].startswith(("./", "../")):
        return {**record, "base": os.path.normpath(Path(folder) / record["base"])}
    return record


def write_stage_record(folder: str | Path, kind: str, base: str) -> None:
    """Write `folder`'s stage record; `base` as the module docstring says."""
    if Path(base).is_dir() and base not in BUILTIN_MODELS:
        if read_stage_record(base) is not None:
            relative = os.path.relpath(os.path.realpath(base), os.path.realpath(folder))
            base = relative if relative.startswith("..") else os.path.join(".", relative)
        else:
            base = os.path.abspath(base)
    write_json(Path(folder) / STAGE_RECORD, {"kind": kind, "base": base})


def load_base_and_tokenizer(name: str, dtype: str, device: Any = "cpu", _chain: tuple[str, ...] = ()):
    """(model, tokenizer, base_name): follows a previous stage's `final/` folder back to its base.

    A LoRA `final/` folder is loaded as base + adapters and merged, so the next stage starts
    from the trained weights with fresh adapters (the standard SFT -> RL hand-off).
    `_chain`: the stage folders already followed, so a record naming itself (or any loop of
    bases) is an error naming the loop, not a RecursionError.
    """
    record = read_stage_record(name)
    if record is not None:
        here = os.path.realpath(name)
        if here in _chain:
            loop = " -> ".join([*_chain[_chain.index(here) :], here])
            raise ValueError(
                f"{Path(_chain[-1]) / STAGE_RECORD}: the stage records' bases form a loop ({loop}); set "
                '"base" in the record to the model these weights were trained on (e.g. tiny-qwen3, '
                "or the previous stage's final/ folder)"
            )
        if record["kind"] == "lora":
            # "base" is the model these adapters were trained on, itself possibly a stage's
            # final/ folder (SFT -> GRPO): resolve the chain down to real weights.
            base, tokenizer, root = load_base_and_tokenizer(record["base"], dtype, device, (*_chain, here))
            _require_adapters(Path(name))
            with unloadable_weights(name), quiet_peft():
                merged = PeftModel.from_pretrained(base, name).merge_and_unload()
            _require_finite(merged, name)
            return merged, tokenizer, root
        model, tokenizer = load_model(name, dtype=DTYPES[dtype], device=device)
        _require_finite(model, name)
        return model, tokenizer, record["base"]
    model, tokenizer = load_model(name, dtype=DTYPES[dtype], device=device)
    return model, tokenizer, name


def load_stage_tokenizer(name: str) -> Any:
    """The tokenizer `load_base_and_tokenizer(name)` returns, without loading a model: a LoRA stage's
    is its base's, followed down the chain (a loop of bases is left to that function to name)."""
    seen: set[str] = set()
    while (record := read_stage_record(name)) is not None and record["kind"] == "lora" and name not in seen:
        seen.add(name)
        name = record["base"]
    return load_tokenizer(name)


def _require_finite(model: torch.nn.Module, folder: str) -> None:
    """ValueError naming the stage output `folder` and its first non-finite weight: a NaN model is
    never merged, served, chatted with or scored (models/finite.py)."""
    bad = first_non_finite(model, trainable_only=False)
    if bad is not None:
        what = "the norm of its weights overflows" if bad == NORM_OVERFLOW else f"its weight {bad!r} is not finite"
        raise ValueError(
            f"'{folder}': {what}, so the run that wrote it diverged; nothing is loaded from it. Use an "
            "earlier checkpoint's weights, or rerun the stage"
        )


def _require_adapters(folder: Path) -> None:
    """ValueError naming `folder` when its record says LoRA but its adapter files are missing."""
    missing = [name for name in ("adapter_config.json", "adapter_model.safetensors") if not (folder / name).is_file()]
    if missing and not (missing == ["adapter_model.safetensors"] and (folder / "adapter_model.bin").is_file()):
        raise ValueError(
            f"'{folder}': its {STAGE_RECORD} says LoRA adapters, but {' and '.join(missing)} "
            "is missing; copy the stage's final/ folder whole, or rerun the stage"
        )


def save_final(
    model: torch.nn.Module,
    tokenizer: Any,
    folder: Path,
    base_name: str,
    accelerator: Any,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write `folder/final`: LoRA adapters (small) or the full model, plus the tokenizer.

    `state_dict`: the model's whole weights when the model itself only holds a shard of them
    (FSDP, ZeRO-3: training/scoring.py `full_policy_state_dict`); None saves the model's own."""
    target = Path(folder) / FINAL_DIR
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(target, state_dict=state_dict)
        tokenizer.save_pretrained(target)
        kind = "lora" if hasattr(unwrapped, "peft_config") else "full"
        write_stage_record(target, kind, base_name)
    accelerator.wait_for_everyone()
    return target


def merge_adapters(adapters: str | Path, out: str | Path) -> Path:
    """Write a standalone HF model directory (base + adapters merged) that transformers and vLLM load."""
    model, tokenizer, base = load_base_and_tokenizer(str(adapters), "float32")
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
