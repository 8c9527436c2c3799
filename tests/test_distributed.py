"""GRPO under `torchrun --nproc_per_node 2` on CPU (gloo), checked against one process.

The trainer shards the B = P·G episodes by stride, so every group spans both ranks
(rank 0: rows 0, 2, 4, 6; rank 1: rows 1, 3, 5, 7). tests/ddp_worker.py records what each
rank saw; this test recomputes the advantages from the raw per-rank rewards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentic_rl.algorithms.grpo import group_advantages

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.fixture(scope="module")
def ddp_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    # No ACCELERATE_USE_CPU here on purpose: a plain torchrun launch must give real gloo DDP.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    env.pop("ACCELERATE_USE_CPU", None)
    command = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(REPO / "tests" / "ddp_worker.py"), str(out)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_rollouts_are_split_by_stride_across_ranks(ddp_records):
    """Guards against every rank rolling out the whole batch (2x the work, duplicated data)."""
    rank0, rank1 = ddp_records
    for step0, step1 in zip(rank0, rank1):
        assert step0["world"] == step1["world"] == 2
        assert step0["rows"] == [0, 2, 4, 6] and step1["rows"] == [1, 3, 5, 7]
        # rows 2g..2g+3 share a prompt: each group of 4 is half on each rank
        for g in range(2):
            assert step0["task_ids"][2 * g] == step0["task_ids"][2 * g + 1] == step1["task_ids"][2 * g]


def test_group_advantages_span_ranks_exactly_as_in_one_process(ddp_records):
    """Guards against per-rank group statistics (a mean over half a group) or a gather that
    puts rewards back in the wrong order."""
    rank0, rank1 = ddp_records
    for step0, step1 in zip(rank0, rank1):
        rewards = torch.empty(8)
        rewards[0::2] = torch.tensor(step0["local_rewards"])
        rewards[1::2] = torch.tensor(step1["local_rewards"])
        assert step0["global_rewards"] == step1["global_rewards"] == pytest.approx(rewards.tolist())
        expected = group_advantages(rewards, 4, "group")  # (8,) single-process reference
        assert float(expected.abs().sum()) > 0, "rewards must vary within groups for this check to mean anything"
        torch.testing.assert_close(torch.tensor(step0["advantages"]), expected[0::2])
        torch.testing.assert_close(torch.tensor(step1["advantages"]), expected[1::2])


def test_parameters_are_identical_on_all_ranks_after_every_step(ddp_records):
    """Guards against un-synchronised gradients (no all-reduce through the DDP wrapper) or a
    rank that skips an update: the replicas would silently drift apart."""
    rank0, rank1 = ddp_records
    assert len(rank0) == len(rank1) == 2
    for step0, step1 in zip(rank0, rank1):
        assert step0["param_digest"] == step1["param_digest"], f"ranks differ after step {step0['step']}"
    assert rank0[0]["param_abs_sum"] != rank0[1]["param_abs_sum"], "the second step must change the weights"
    assert rank0[0]["param_abs_sum"] > 0


def test_logged_rollout_metrics_cover_the_whole_batch_on_every_rank(ddp_records):
    """Guards against per-rank statistics (each rank logging the mean of its own half): reward
    components and rollout numbers must be the whole batch's, and the same on both ranks."""
    rank0, rank1 = ddp_records
    for step0, step1 in zip(rank0, rank1):
        assert step0["metrics"] == step1["metrics"]
        rewards = step0["global_rewards"]
        parity = torch.tensor(rewards)  # total = token_parity + 0.5 * format, and format is 0 here
        assert step0["metrics"]["reward/format/mean"] == 0.0
        assert step0["metrics"]["reward/token_parity/mean"] == pytest.approx(
            float(parity.mean()), abs=1e-6
        )  # total is float32
        assert step0["metrics"]["reward/token_parity/std"] == pytest.approx(float(parity.std()), abs=1e-6)
        tokens = step0["policy_tokens"] + step1["policy_tokens"]
        assert step0["metrics"]["rollout/completion_tokens/mean"] == pytest.approx(sum(tokens) / 8)
