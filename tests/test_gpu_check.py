"""benchmarks/gpu_check.py's CPU smoke run: every section runs and reports sane figures, so the
script is ready for the next GPU (where its results go into BENCHMARKS.md).

Runs `--device cpu --tiny --grpo-backends ours` as a subprocess (TRL's side of grpo_step is left
out: ~30 s per tiny step on 2 CPU cores; it was run by hand, see BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "check.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
    }
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "gpu_check.py"),
        "--device",
        "cpu",
        "--tiny",
        "--grpo-backends",
        "ours",
        "--out",
        str(out),
    ]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert json.loads(line) == json.loads(out.read_text()), "the last stdout line is the --out JSON"
    return json.loads(line)


def test_every_section_runs_and_the_run_is_labelled(report):
    """Guards against a section that fails silently on the GPU machine, where a rerun costs minutes."""
    assert (report["device"], report["tiny"]) == ("cpu", True)
    assert set(report["sections"]) == {"correctness", "throughput", "evaluation", "memory", "grpo_step"}
    for name, section in report["sections"].items():
        assert section["ok"], f"{name}: {section.get('error')}\n{section.get('trace')}"
        assert section["seconds"] > 0


def test_sampling_logprobs_match_the_training_forward_across_turns(report):
    """Guards against a KV cache that goes stale across tool observations (later turns would
    diverge) and a loss mask that covers observation tokens."""
    c = report["sections"]["correctness"]
    assert c["turns"] == [3, 3, 3, 3] and c["policy_tokens"] == 4 * 3 * 8
    assert c["max_abs_diff_first_turn"] < 1e-4 and c["max_abs_diff_later_turns"] < 1e-4  # float32 on CPU
    assert c["mask_errors"] == 0


def test_throughput_grpo_and_memory_report_positive_figures(report):
    """Guards against a section that "succeeds" with empty or zero figures (a timer that never ran)."""
    t, g, m = (report["sections"][k] for k in ("throughput", "grpo_step", "memory"))
    for batch in (4, 8):
        assert t[f"engine_b{batch}_tok_s"] > 0 and t[f"generate_b{batch}_tok_s"] > 0
    for setting in ("lora", "full"):
        assert (
            g[f"ours_{setting}_s"] > 0 and 0 < g[f"ours_{setting}_tokens"] <= 8
        )  # at most max_turn_tokens per episode
    assert m["train_loss"] > 0 and m["kv_cache_gb"] is None and m["train_peak_gb"] is None  # CUDA-only figures


def test_the_evaluation_runs_where_rollout_device_auto_puts_it(report):
    """Guards against an eval that decodes on the CPU of a GPU machine (auto -> cuda there; the
    section itself fails when the model is not on the --device it was run for)."""
    from agentic_rl.models.precision import resolve_rollout_dtype

    e = report["sections"]["evaluation"]
    assert (e["model_device"], e["problems"]) == ("cpu", 16)  # CUDA_VISIBLE_DEVICES="": auto -> cpu
    assert e["decode_dtype"] == resolve_rollout_dtype("auto", "cpu")  # float32 on AVX2, bfloat16 on AVX512/AMX
    assert e["load_s"] > 0 and e["eval_s"] > 0
