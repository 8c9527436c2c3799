"""FSDP (accelerate's FSDP2) on 2 CPU processes (gloo), checked against one process.

`accelerate launch --config_file configs/accelerate/fsdp.yaml` runs one SFT step on tiny-qwen3
(tests/fsdp_worker.py), LoRA and full fine-tuning; the same step in this process, on the same
global batch of 4 demonstrations, is the reference. Under FSDP each rank holds half of every
weight, sees 2 of the 4 demonstrations, and the gradients are reduce-scattered, so the loss
(the mean of the ranks' shares), the gradient norm and the weights after the AdamW step must be
those of one process, to float rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp_worker import sft_cfg  # noqa: E402
from agentic_rl.models.loader import build_tiny_qwen3  # noqa: E402
from agentic_rl.training.sft import train_sft  # noqa: E402

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
ACCELERATE = Path(sys.executable).with_name("accelerate")
MODES = ("lora", "full")


def _launch(out: Path, mode: str) -> list[dict]:
    # No ACCELERATE_USE_CPU: the config file alone must give FSDP on a machine without a GPU.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    env.pop("ACCELERATE_USE_CPU", None)
    command = [
        str(ACCELERATE),
        "launch",
        "--config_file",
        str(REPO / "configs" / "accelerate" / "fsdp.yaml"),
        "--main_process_port",
        "0",
        str(REPO / "tests" / "fsdp_worker.py"),
        str(out),
        mode,
    ]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{mode: (rank records, FSDP final/ weights, one-process row, one-process final/ weights)}."""
    found = {}
    for mode in MODES:
        out = tmp_path_factory.mktemp(f"fsdp-{mode}")
        ranks = _launch(out, mode)
        # The ranks run one thread each: so does the reference, so that its float sums take the
        # order closest to theirs (sft_cfg's eps keeps Adam from magnifying what remains).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            single = train_sft(sft_cfg(out / "single", mode))
        finally:
            torch.set_num_threads(threads)
        weights = _final_weights(out / "run" / "final")
        found[mode] = (ranks, weights, single["history"][0], _final_weights(Path(single["final"])))
    return found


def _final_weights(folder: Path) -> dict[str, torch.Tensor]:
    name = "adapter_model.safetensors" if (folder / "adapter_model.safetensors").exists() else "model.safetensors"
    return load_file(folder / name)


@pytest.mark.parametrize("mode", MODES)
def test_the_launch_really_shards_the_weights(runs, mode):
    """Guards against an FSDP config that silently runs as DDP (accelerate does so on CPU) or
    that wraps only the root (no per-layer sharding: all-gathers of the whole model)."""
    ranks = runs[mode][0]
    for rank, record in enumerate(ranks):
        assert (record["rank"], record["world"], record["distributed_type"]) == (rank, 2, "FSDP")
        assert record["fsdp_modules"] == 3, "the root and each of tiny-qwen3's 2 decoder layers"
    # The (151,669 × 64) embedding is split by rows: 75,835 on rank 0, 75,834 on rank 1.
    assert [r["embed_local_numel"] for r in ranks] == [75_835 * 64, 75_834 * 64]
    assert ranks[0]["embed_numel"] == 151_669 * 64


@pytest.mark.parametrize("mode", MODES)
def test_loss_and_gradient_norm_equal_one_process_on_the_same_global_batch(runs, mode):
    """Guards against a per-rank normaliser (each rank dividing by its own tokens) or gradients
    averaged over the wrong group: the global loss and gradient norm would differ."""
    ranks, _, single, _ = runs[mode]
    global_loss = sum(r["row"]["loss/total"] for r in ranks) / 2  # each rank's share is scaled by world / total tokens
    assert global_loss == pytest.approx(single["loss/total"], rel=1e-6)
    assert ranks[0]["row"]["loss/total"] != pytest.approx(ranks[1]["row"]["loss/total"], rel=1e-3), (
        "the ranks must see different demonstrations"
    )
    for record in ranks:
        assert record["row"]["optim/grad_norm"] == pytest.approx(single["optim/grad_norm"], rel=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_weights_after_one_step_equal_one_process(runs, mode):
    """Guards against a save that writes one rank's shard (or the untrained weights) and against
    an optimizer step on unsynchronised shards: final/ must hold the one-process weights."""
    _, weights, _, single = runs[mode]
    assert weights.keys() == single.keys() and len(weights) > 0
    initial = build_tiny_qwen3().state_dict()
    moved = 0.0
    for name, tensor in single.items():
        torch.testing.assert_close(
            weights[name], tensor, rtol=0, atol=2e-6, msg=f"{mode}: {name} differs from one process"
        )
        if name in initial:
            moved = max(moved, float((tensor - initial[name]).abs().max()))
        else:  # LoRA: B starts at 0, so any change is the step's
            moved = max(moved, float(tensor.abs().max()))
    assert moved > 1e-3, "one step at lr 1e-2 must move the weights"
