"""Worker for tests/test_fsdp.py: one SFT step on tiny-qwen3 under FSDP, recording per rank what
the loop saw.

    accelerate launch --config_file configs/accelerate/fsdp.yaml --main_process_port 0 \
        tests/fsdp_worker.py OUT_DIR lora|full

Writes OUT_DIR/run/final/ (the whole weights, gathered from the shards by `save_final`) and
OUT_DIR/rank<k>.json: the logged step row, the launch's distributed type, how many modules FSDP
sharded, and how many elements of the embedding this rank holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from agentic_rl.config import load_config
from agentic_rl.training.sft import SFTConfig, SFTObjective, train_sft


def sft_cfg(output_dir: Path, mode: str) -> SFTConfig:
    """The run both sides make: 4 demonstrations per step (2 per rank under FSDP), one per
    micro-batch, so each rank also accumulates over 2 micro-batches.

    Adam's first step is lr·g/(|g|+eps): at the default eps 1e-8 that is ≈ lr·sign(g), so a
    gradient near 0 whose sign differs by float summation order (FSDP reduces in another order
    than one process) moves its weight by ±lr. eps 1e-3 makes the step continuous in g, so the
    two sides' weights differ by about their gradients' rounding, times lr/eps."""
    return load_config(
        SFTConfig,
        None,
        overrides=[
            "model.name=tiny-qwen3",
            "model.lora.r=4",
            f"model.lora.enabled={'true' if mode == 'lora' else 'false'}",
            "optim.lr=1e-2",
            "optim.eps=1e-3",
            "batch_size=4",
            "micro_batch_size=1",
            "sources=[{kind: oracle, env: {name: arith, options: {difficulty: 1}}, n: 8}]",
            f"train.output_dir={output_dir}",
            "train.progress=false",
            "train.steps=1",
            "train.resume=false",
        ],
    )


def main(out: Path, mode: str) -> None:
    seen = {}
    original_bind = SFTObjective.bind

    def bind(self, model, accelerator):
        from torch.distributed.fsdp import FSDPModule

        embed = next(p for name, p in model.named_parameters() if name.endswith("embed_tokens.weight"))
        local = embed.to_local() if hasattr(embed, "to_local") else embed
        seen.update(
            {
                "distributed_type": str(accelerator.distributed_type).split(".")[-1],
                "fsdp_modules": sum(isinstance(m, FSDPModule) for m in model.modules()),
                "embed_local_numel": local.numel(),
                "embed_numel": embed.numel(),
                "rank": accelerator.process_index,
                "world": accelerator.num_processes,
            }
        )
        original_bind(self, model, accelerator)

    SFTObjective.bind = bind
    result = train_sft(sft_cfg(out / "run", mode))
    (out / f"rank{seen['rank']}.json").write_text(json.dumps({**seen, "row": result["history"][0]}))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2])
