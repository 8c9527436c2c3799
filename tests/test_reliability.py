"""Reliability: what a careless user or a hostile model output does to a run (issue 16).

Run: .venv/bin/pytest tests/test_reliability.py -q      (about 20 s; tiny-qwen3 and toy models)

Every test here failed on the code before issue 16. The hostile python programs live in
tests/sandbox_hostile.py and run from tests/test_python_sandbox.py.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from agentic_rl import cli
from agentic_rl.config import ConfigError, load_config
from agentic_rl.train_commands import config_class
from agentic_rl.training.checkpoint import latest_checkpoint
from agentic_rl.training.common import make_accelerator
import agentic_rl.training.loop
from agentic_rl.training.loop import LoopConfig, OptimConfig, BatchObjective, run_training
from agentic_rl.training.metrics_file import read_metrics
from agentic_rl.training.run_dir import RunDir

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "agentic_rl"


def _reject(constant: str):
    raise ValueError(f"not strict JSON: {constant}")


def loads_strict(text: str):
    """The test's own strict parser (independent of agentic_rl.strict_json)."""
    return json.loads(text, parse_constant=_reject)


def _non_finite_error():
    return getattr(agentic_rl.training.loop, "NonFiniteError", type("NonFiniteErrorMissing", (Exception,), {}))


# ------------------------------------------------------------------ configs a careless user writes


@pytest.mark.parametrize(
    "config, override, key",
    [
        ("sft", "optim.lr=inf", "optim.lr"),
        ("sft", "optim.lr=.nan", "optim.lr"),
        ("grpo", "rollout.sampling.temperature=nan", "rollout.sampling.temperature"),
        ("grpo", "rewards=[{name: accuracy, weight: .nan}]", "rewards[0].weight"),
        ("grpo", "env.options={tool_success_reward: .inf}", "env.options.tool_success_reward"),
        ("grpo", "rewards=[{name: step_bonus, params: {beta: -.inf}}]", "rewards[0].params.beta"),
    ],
)
def test_non_finite_config_values_are_rejected_naming_the_key(config, override, key):
    """Guards against lr=inf, temperature=nan or a reward weight of .nan training a run whose
    adapters are all NaN and that still exits 0."""
    cls = config_class(config)
    with pytest.raises(ConfigError, match=rf"'{re.escape(key)}' must be a finite number"):
        load_config(cls, None, [override])


@pytest.mark.parametrize(
    "config, override, key",
    [
        ("grpo", "rollout.batch_size=0", "rollout.batch_size"),
        ("grpo", "micro_batch_size=0", "micro_batch_size"),
        ("sft", "optim.eps=0", "optim.eps"),
        ("rm", "batch_size=-8", "batch_size"),
        ("sft", "model.lora.alpha=0", "model.lora.alpha"),
    ],
)
def test_zero_or_negative_where_a_positive_number_is_needed_is_rejected(config, override, key):
    """Guards against batch_size=0 failing later with a cryptic error (or looping on nothing)."""
    with pytest.raises(ConfigError, match=rf"'{re.escape(key)}' must be > 0"):
        load_config(config_class(config), None, [override])


def test_eval_flags_go_through_the_same_checks(capsys):
    """Guards against `agentic-rl eval --max-concurrent 0` building a config the loader would reject."""
    assert cli.main(["eval", "--model", "tiny-qwen3", "--env", "arith", "--max-concurrent", "0"]) == 2
    assert "'max_concurrent' must be > 0" in capsys.readouterr().err


def test_duplicate_yaml_keys_are_rejected_with_the_key_and_lines(tmp_path):
    """Guards against the second `lr:` silently winning over the first."""
    path = tmp_path / "dup.yaml"
    path.write_text("optim:\n  lr: 1.0e-5\n  weight_decay: 0.0\n  lr: 3.0e-4\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: .*duplicate key 'lr' at line 4 \(first at line 2\)"):
        load_config(config_class("sft"), path)


# ------------------------------------------------------------------ non-finite values in a run


class _Objective(BatchObjective):
    """Least squares on a Linear(4, 1); `poison(step, model, loss)` may corrupt one step."""

    def __init__(self, poison=None):
        self.poison = poison

    def bind(self, model, accelerator):
        pass

    def next_batch(self, step):
        self.at = step  # not `step`: that is the objective's step method (training/loop.py)
        x = torch.randn(8, 4)  # (B, 4)
        return x, x.sum(-1)

    def micro_batches(self, batch):
        return [batch]

    def loss(self, model, micro):
        x, y = micro
        loss = ((model(x).squeeze(-1) - y) ** 2).mean()
        if self.poison:
            loss = self.poison(self.at, model, loss)
        return loss, {}


def _run(out: Path, objective, steps=4, lr=0.05, checkpoint_every=1, keep=5, max_grad_norm=1.0):
    accelerator = make_accelerator("no", seed=0)
    model = torch.nn.Linear(4, 1)
    loop = LoopConfig(
        steps=steps, output_dir=str(out), checkpoint_every=checkpoint_every, keep_checkpoints=keep, progress=False
    )
    optim = OptimConfig(lr=lr, max_grad_norm=max_grad_norm)
    history = run_training(objective, model, loop, optim, accelerator, RunDir(out, loop, tensorboard=False))
    return accelerator.unwrap_model(model), history


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_finite_checkpoint(tmp_path):
    """Guards against a run that goes NaN saving NaN adapters and reporting success."""
    poison = lambda step, model, loss: loss * float("nan") if step == 2 else loss  # noqa: E731
    with pytest.raises(
        _non_finite_error(), match=r"step 3: the loss of micro-batch 0 is nan.*last finite checkpoint is .*step-000002"
    ):
        _run(tmp_path, _Objective(poison))
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step-000002"
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_a_non_finite_gradient_stops_the_run_before_the_weights_change(tmp_path):
    """Guards against an inf gradient (finite loss) reaching the optimizer, with clipping off."""

    def poison(step, model, loss):
        if step == 1:
            model.weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return loss

    with pytest.raises(_non_finite_error(), match="step 2: the gradient norm is inf"):
        _run(tmp_path, _Objective(poison), max_grad_norm=0.0, checkpoint_every=0)


def test_a_weight_that_overflows_after_the_step_stops_the_run(tmp_path):
    """Guards against weights turning inf through the update itself (huge lr), with finite
    losses and gradients: nothing but a weight check sees it."""
    poison = lambda step, model, loss: (model.weight * 1e-3).sum()  # noqa: E731 - gradient 1e-3, loss stays finite
    with pytest.raises(
        _non_finite_error(),
        match=r"step 1: weight 'weight' is not finite after the optimizer step.*no checkpoint was written yet",
    ):
        _run(tmp_path, _Objective(poison), lr=3e38, checkpoint_every=0)


def test_a_nan_reward_stops_grpo_and_the_cli_exits_non_zero(tmp_path, capsys):
    """Guards against NaN rewards flowing into advantages and weights with exit code 0."""
    from agentic_rl.rewards.base import list_rewards, register_reward

    if "nan_on_second_batch" not in list_rewards():
        calls = []

        @register_reward("nan_on_second_batch")
        def nan_on_second_batch(traj) -> float:
            """1.0, then NaN from the fifth episode on (test only)."""
            calls.append(1)
            return 1.0 if len(calls) <= 4 else float("nan")

    tiny = [
        "model.name=tiny-qwen3",
        "model.lora.r=4",
        "rollout.batch_size=4",
        "rollout.group_size=2",
        "rollout.max_turn_tokens=4",
        "rollout.max_turns=1",
        "env.options={difficulty: 1}",
        "env.task_pool=8",
        "rewards=[{name: nan_on_second_batch}, {name: format}]",
        "micro_batch_size=4",
        "train.progress=false",
        "train.steps=2",
        "train.checkpoint_every=1",
        f"train.output_dir={tmp_path}",
    ]
    assert cli.main(["grpo", *[arg for item in tiny for arg in ("--set", item)]]) == 3
    err = capsys.readouterr().err
    assert re.search(r"error: step 2: the loss of micro-batch 0 is nan.*step-000001", err), err
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step-000001"
    assert not (tmp_path / "final").exists()


# ------------------------------------------------------------------ checkpoints are data


def _three_checkpoints(tmp_path: Path) -> Path:
    _run(tmp_path, _Objective(), steps=3)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step-000001", "step-000002", "step-000003"]
    return folder


def _rewrite_checksum(checkpoint: Path, name: str) -> None:
    """Make checksums.json (if any) match a changed file, as someone with write access could."""
    import hashlib

    record = checkpoint / "checksums.json"
    if record.exists():
        checksums = json.loads(record.read_text())
        data = (checkpoint / name).read_bytes()
        checksums[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        record.write_text(json.dumps(checksums))


def _resumed_step(tmp_path: Path, caplog) -> tuple[int, str]:
    """Resume with steps=4; returns (first step trained again, warnings logged)."""
    with caplog.at_level(logging.WARNING, logger="agentic_rl.training.checkpoint"):
        _, history = _run(tmp_path, _Objective(), steps=4)
    return 4 - len(history) + 1, caplog.text


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, caplog, damage):
    """Guards against a few changed bytes resuming silently into NaN, and a truncated or
    missing file giving a traceback instead of using the previous intact checkpoint."""
    folder = _three_checkpoints(tmp_path)
    weights = folder / "step-000003" / "pytorch_model.bin"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        weights.write_bytes(data[:-40] + bytes(b ^ 0xFF for b in data[-40:-36]) + data[-36:])
    else:
        weights.unlink()
    first_step, warnings = _resumed_step(tmp_path, caplog)
    assert first_step == 3  # resumed from step-000002
    assert "skipped newer damaged checkpoint(s): step-000003 (pytorch_model.bin" in warnings


def test_a_pickle_that_runs_code_is_refused_even_with_matching_checksums(tmp_path):
    """Guards against torch.load(weights_only=False): a crafted trainer state ran code on resume.
    The checksums are rewritten to match, as an attacker with write access would."""
    folder = _three_checkpoints(tmp_path)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (Path.write_text, (marker, "code ran"))

    newest = folder / "step-000003"
    torch.save({"step": 3, "objective": Exploit()}, newest / "trainer_state.pt")  # a valid torch file
    _rewrite_checksum(newest, "trainer_state.pt")
    from agentic_rl.training.checkpoint import CheckpointError

    # Refused as before, but named: the checkpoint, why, and the way on (not a raw UnpicklingError).
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint .*step-000003 cannot be restored \(UnpicklingError: "
        r"'Weights only load failed.*Delete .*step-000003 to resume from an older checkpoint",
    ):
        _run(tmp_path, _Objective(), steps=4)
    assert not marker.exists()


def test_wrong_shape_weights_in_a_checkpoint_are_refused_naming_it(tmp_path):
    """Guards against a checkpoint whose weights have another shape (checksums rewritten to match)
    failing as a raw RuntimeError ("size mismatch for weight") with no file and no way on."""
    folder = _three_checkpoints(tmp_path)
    newest = folder / "step-000003"
    torch.save(
        {"weight": torch.zeros(3, 4), "bias": torch.zeros(3)}, newest / "pytorch_model.bin"
    )  # Linear(4, 3), not (4, 1)
    _rewrite_checksum(newest, "pytorch_model.bin")
    from agentic_rl.training.checkpoint import CheckpointError

    with pytest.raises(
        CheckpointError,
        match=r"step-000003 cannot be restored \(RuntimeError: .*size mismatch.*"
        r"tensors of another shape.*train.resume=false",
    ):
        _run(tmp_path, _Objective(), steps=4)


def test_no_intact_checkpoint_is_an_error_not_a_silent_restart(tmp_path):
    """Guards against every checkpoint being damaged and the run quietly starting from step 0."""
    folder = _three_checkpoints(tmp_path)
    for checkpoint in folder.iterdir():
        (checkpoint / "optimizer.bin").write_bytes(b"")
    from agentic_rl.training.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"no intact checkpoint .*step-000003 \(optimizer.bin has 0 bytes"):
        _run(tmp_path, _Objective(), steps=4)


def test_an_unreadable_rng_state_is_a_warning(tmp_path, caplog):
    """Guards against accelerate noting a lost RNG state at INFO only: the resume then is not
    exact and nobody is told. (Checksums rewritten, so only the content is wrong.)"""
    folder = _three_checkpoints(tmp_path)
    newest = folder / "step-000003"
    (newest / "random_states_0.pkl").write_bytes(b"not a pickle")
    _rewrite_checksum(newest, "random_states_0.pkl")
    first_step, warnings = _resumed_step(tmp_path, caplog)
    assert first_step == 4
    assert "random_states_0.pkl cannot be read" in warnings and "NOT exact" in warnings


# ------------------------------------------------------------------ strict JSON everywhere


def test_the_writer_turns_non_finite_values_into_null():
    """Guards against NaN/Infinity tokens, which strict parsers reject."""
    from agentic_rl.strict_json import dumps

    payload = {
        "a": float("nan"),
        "b": [float("inf"), -float("inf"), 1.5],
        "c": np.float32("nan"),
        "d": torch.tensor(float("inf")),
        "e": np.int64(3),
        "f": Path("/x"),
    }
    assert loads_strict(dumps(payload)) == {"a": None, "b": [None, None, 1.5], "c": None, "d": None, "e": 3, "f": "/x"}
    with pytest.raises(ValueError, match="not strict JSON: NaN"):
        loads_strict(json.dumps({"a": float("nan")}))


def test_metrics_done_results_and_manifest_files_are_strict_json(tmp_path):
    """Guards against metrics.jsonl, DONE.json, results.json and the model-cache manifest
    carrying NaN (e.g. tool_success_rate with zero tool calls)."""
    from types import SimpleNamespace

    from agentic_rl.evaluation.report import write_report
    from agentic_rl.models.loader import _MANIFEST, _write_manifest
    from agentic_rl.pipeline import _write_atomic

    run = RunDir(tmp_path / "run", tensorboard=False)
    run.log(1, {"loss/total": float("nan"), "optim/grad_norm": float("inf"), "reward/total/mean": 0.5})
    line = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert loads_strict(line) == {"step": 1, "loss/total": None, "optim/grad_norm": None, "reward/total/mean": 0.5}
    assert math.isnan(read_metrics(tmp_path / "run" / "metrics.jsonl")[0]["loss/total"])  # null reads back as NaN

    evals = {"arith": {"pass@1": 0.0, "tool_success_rate": float("nan"), "failures": []}}
    _write_atomic(tmp_path / "eval_base" / "DONE.json", {"model": "m", "evals": evals, "seconds": float("inf")})
    loads_strict((tmp_path / "eval_base" / "DONE.json").read_text())
    write_report(tmp_path, {"eval_base": {"model": "m", "evals": evals}}, SimpleNamespace(model="m"))
    assert (
        loads_strict((tmp_path / "results.json").read_text())["eval_base"]["evals"]["arith"]["tool_success_rate"]
        is None
    )

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    _write_manifest(tmp_path / "model")
    assert set(loads_strict((tmp_path / "model" / _MANIFEST).read_text())) == {"config.json"}


def test_eval_json_and_the_final_model_record_are_strict_json(tmp_path, capsys, tiny_qwen3):
    """Guards against `eval --json` printing NaN (no tool calls: tool_success_rate = 0/0) and
    agentic_rl_model.json being written by hand."""
    from agentic_rl.models.stage_output import save_final

    assert (
        cli.main(
            [
                "eval",
                "--model",
                "tiny-qwen3",
                "--env",
                "arith",
                "--n",
                "1",
                "--max-turn-tokens",
                "2",
                "--max-turns",
                "1",
                "--json",
            ]
        )
        == 0
    )
    payload = loads_strict(capsys.readouterr().out.strip().splitlines()[-1])
    assert payload["tool_success_rate"] is None
    model, tokenizer = tiny_qwen3
    final = save_final(model, tokenizer, tmp_path, "tiny-qwen3", make_accelerator("no"))
    assert loads_strict((final / "agentic_rl_model.json").read_text()) == {"kind": "full", "base": "tiny-qwen3"}


@pytest.mark.parametrize("kind", ["fifo", "symlink", "folder"])
def test_an_output_path_that_is_not_a_regular_file_is_refused_and_left_as_it_was(tmp_path, capsys, kind):
    """Guards against the atomic rename replacing what the path points at: `eval --out /dev/full`
    (as root) replaced the host's /dev/full with a JSON file; a FIFO or a symlink was replaced by
    a file likewise. A FIFO and a symlink stand in for the device node (same code path, no root)."""
    import os

    from agentic_rl.strict_json import write_json

    target = tmp_path / "out.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_text("keep\n")
        target.symlink_to(tmp_path / "elsewhere.json")
    else:
        target.mkdir()
    expected = {"fifo": "is a FIFO", "symlink": "is a symbolic link (to ", "folder": "is a folder"}[kind]
    with pytest.raises(ValueError, match=re.escape(f"'{target}' {expected}")):
        write_json(target, {"a": 1})
    if kind != "folder":  # a folder is eval's own earlier check ("give a file name")
        assert cli.main(["eval", "--model", "tiny-qwen3", "--env", "arith", "--n", "1", "--out", str(target)]) == 2
        assert f"'{target}' {expected}" in capsys.readouterr().err
    assert target.is_fifo() if kind == "fifo" else target.is_symlink() if kind == "symlink" else target.is_dir()
    if kind == "symlink":
        assert (tmp_path / "elsewhere.json").read_text() == "keep\n"


def test_no_module_writes_json_except_through_the_strict_writer():
    """Guards against a new call site bypassing strict_json (json.dump to a file, or
    write_text(json.dumps(...)) / print(json.dumps(...)))."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "strict_json.py":
            continue
        text = path.read_text()
        for pattern in (
            r"json\.dump\(",
            r"write_text\(\s*json\.dumps",
            r"write\(\s*json\.dumps",
            r"print\(\s*json\.dumps",
        ):
            offenders += [f"{path.relative_to(SRC)}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert offenders == []


# ------------------------------------------------------------------ data files and models


def test_an_empty_data_file_names_the_file(tmp_path):
    """Guards against an empty GSM8K file giving no message, then "Sample larger than population"."""
    from agentic_rl.data import DataError, load_gsm8k

    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}: no problems in the file"):
        load_gsm8k(path)


def test_a_non_utf8_data_file_names_the_file_and_line(tmp_path, qwen3_tokenizer):
    """Guards against a UnicodeDecodeError that names no file or line."""
    from agentic_rl.data import DataError, load_gsm8k
    from agentic_rl.models.chat_format import ChatFormat
    from agentic_rl.rollout.demos import DemoError, load_jsonl_demos

    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}:2: not UTF-8 text \(byte 18"):
        load_gsm8k(path)
    demos = tmp_path / "demos.jsonl"
    demos.write_bytes(b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n')
    with pytest.raises(DemoError, match=rf"{re.escape(str(demos))}:1: not UTF-8"):
        load_jsonl_demos(demos, ChatFormat(qwen3_tokenizer))


def test_a_missing_model_directory_is_a_clear_error(capsys):
    """Guards against `eval --model /nonexistent` printing a raw traceback from the hub client."""
    assert cli.main(["eval", "--model", "/nonexistent/model", "--env", "arith", "--n", "1"]) == 2
    assert "error: model directory '/nonexistent/model' does not exist" in capsys.readouterr().err


def test_an_unknown_hub_id_fails_fast_when_offline(capsys, monkeypatch):
    """Guards against a bare `nosuch/model` spending ~50 s on network retries before failing."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    assert cli.main(["eval", "--model", "nosuch/model", "--env", "arith", "--n", "1"]) == 2
    assert time.monotonic() - started < 5
    assert "'nosuch/model' is not a local directory and not in the Hugging Face cache" in capsys.readouterr().err


# ------------------------------------------------------------------ model output inside an episode


@pytest.mark.parametrize(
    "arguments",
    [
        '{"expression": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"expression": ' + "9" * 5000 + "}",
        '"' + "[" * 100_000 + '"',
    ],
)
def test_hostile_tool_call_json_is_an_error_observation_not_an_exception(arguments):
    """Guards against deeply nested arguments (RecursionError) or a 5000-digit integer
    (ValueError) raising out of env.step, against the parser's own contract."""
    from agentic_rl.envs.base import make_env

    env = make_env("arith")
    env.reset(env.tasks("test", n=1, seed=0)[0])
    result = env.step(f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>')
    assert result.info["tool_errors"] == 1
    assert result.observation[0]["content"].startswith("Error: ")


def test_a_failed_python_call_is_a_tool_error_for_metrics_and_rewards():
    """Guards against a traceback inside the python tool counting as a successful call:
    tool_errors 0, tool_success_reward paid, tool_use reward 1.0."""
    from agentic_rl.envs.gsm8k import GSM8KEnv, GSM8KOptions
    from agentic_rl.rewards.base import get_reward
    from agentic_rl.rollout.trajectory import Span, Trajectory

    env = GSM8KEnv(GSM8KOptions(tools=["python"], tool_success_reward=1.0))
    env.reset(env.tasks("test", n=1, seed=0)[0])
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1/0)"}}\n</tool_call>'
    result = env.step(call)
    assert (result.reward, result.info["tool_calls"], result.info["tool_errors"]) == (0.0, 1, 1)
    assert result.observation[0]["content"].endswith("ZeroDivisionError: division by zero")
    episode = Trajectory([1], [0], [0.0], [Span("prompt", 0, 1)], info=dict(result.info))
    assert get_reward("tool_use")([episode]) == [0.0]
