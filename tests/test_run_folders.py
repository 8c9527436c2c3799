"""Reusing a run folder (training/run_dir.py): one rule for every training command, on real
tiny-qwen3 SFT runs of 2 steps. Each test names the silently wrong behaviour it guards against."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentic_rl import cli
from agentic_rl.config import ConfigError, load_config
from agentic_rl.training.checkpoint import CheckpointError
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.metrics_file import read_metrics
from agentic_rl.training.run_lock import LOCK, unlock_run_folder
from agentic_rl.training.sft import SFTConfig, train_sft

TINY = [
    "model.name=tiny-qwen3",
    "model.lora.r=4",
    "optim.lr=1e-2",
    "batch_size=4",
    "micro_batch_size=4",
    "sources=[{kind: oracle, env: {name: arith, options: {difficulty: 1}}, n: 4}]",
    "train.progress=false",
]


def _sft_cfg(out: Path, *extra: str) -> SFTConfig:
    return load_config(SFTConfig, None, overrides=[*TINY, f"train.output_dir={out}", "train.steps=2", *extra])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished 2-step SFT run (lr 1e-2, seed 0); tests work on copies of it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = train_sft(_sft_cfg(out))
    return out, result


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished_run[0], out)  # as a user copies one: the record names final/ relative to its folder
    return out


def _refuse(*args, **kwargs):
    raise AssertionError("a model was loaded before the run folder was checked")


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any model load fails: a rerun that gets that far did work before checking the folder."""
    for where in ("agentic_rl.training.sft", "agentic_rl.training.on_policy"):  # on_policy: GRPO's and PPO's
        monkeypatch.setattr(f"{where}.load_policy", _refuse)
    return _refuse


def _fingerprints(folder: Path) -> dict[str, str]:
    """Every file's hash, but the lock's (run.lock names whichever process last held the folder)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK
    }


def test_a_rerun_with_another_config_stops_before_any_work_naming_each_key(run_copy, no_model_loading):
    """Guards against a longer rerun with a new learning rate and seed restoring the old optimizer
    and schedule (logging the old rate) while config.yaml claimed the new ones."""
    before = _fingerprints(run_copy)
    with pytest.raises(ConfigError) as caught:
        train_sft(_sft_cfg(run_copy, "train.steps=4", "optim.lr=1e-3", "train.seed=3"))
    message = str(caught.value)
    assert "optim.lr: 0.01 (recorded) -> 0.001 (now)" in message
    assert "train.seed: 0 (recorded) -> 3 (now)" in message
    assert "train.steps" not in message.split("Differing keys:")[1].split("Set train.resume")[0]  # may change
    assert "train.resume=false" in message and "another train.output_dir" in message
    assert _fingerprints(run_copy) == before  # config.yaml, metrics, checkpoints and final/ untouched


def test_a_setting_newer_than_the_record_differs_only_when_set_away_from_its_default(
    run_copy, no_model_loading, capsys
):
    """Guards against every run folder made before a new setting existed (`plugins`, `enable_thinking`)
    refusing to resume as "made with another config", when the setting at its default is what that
    run had in effect; set to another value, it is a difference like any other."""
    record = json.loads((run_copy / "run.json").read_text())
    del record["config"]["plugins"], record["config"]["enable_thinking"]  # as a run of an older version records it
    (run_copy / "run.json").write_text(json.dumps(record))
    train_sft(_sft_cfg(run_copy))  # the same run, finished: no differing key
    assert f"the run in {run_copy} finished at step 2; nothing to train" in capsys.readouterr().out
    with pytest.raises(
        ConfigError, match=r"Differing keys:\n  enable_thinking: \(absent\) \(recorded\) -> false \(now\)\nSet"
    ):
        train_sft(_sft_cfg(run_copy, "enable_thinking=false"))


@pytest.mark.parametrize("backend", ["agentic_rl", "trl"])
def test_another_command_cannot_resume_the_folder(run_copy, no_model_loading, monkeypatch, backend):
    """Guards against `grpo` resuming an `sft` folder's checkpoint and mixing both runs in one
    metrics.jsonl (the issue's case was `sft` into a `grpo` folder; the rule is the same)."""
    from agentic_rl.integrations.backends import train_grpo_with_backend as run_grpo

    monkeypatch.setattr("agentic_rl.integrations.trl_backend.build_trl_trainer", no_model_loading)
    before = _fingerprints(run_copy)
    grpo = load_config(
        GRPOConfig,
        None,
        overrides=["model.name=tiny-qwen3", f"train.output_dir={run_copy}", "train.steps=2", f"backend={backend}"],
    )
    with pytest.raises(ConfigError, match=r"holds a `sft` run .*`grpo` cannot resume it.*train.resume=false"):
        run_grpo(grpo)
    assert _fingerprints(run_copy) == before


def test_a_finished_run_says_so_and_does_not_rewrite_its_folder(
    finished_run, run_copy, no_model_loading, monkeypatch, capsys
):
    """Guards against a finished run "resuming": loading models, training nothing, rewriting
    config.yaml and re-exporting final/. It returns what it recorded; a larger train.steps
    trains on from there."""
    before = _fingerprints(run_copy)
    again = train_sft(_sft_cfg(run_copy))
    assert f"the run in {run_copy} finished at step 2; nothing to train" in capsys.readouterr().out
    assert _fingerprints(run_copy) == before
    first = finished_run[1]
    assert again["final"] == str(run_copy / "final") and again["num_demos"] == first["num_demos"]
    assert [row["loss/total"] for row in again["history"]] == [row["loss/total"] for row in first["history"]]

    monkeypatch.undo()  # models load again
    longer = train_sft(_sft_cfg(run_copy, "train.steps=3"))
    assert len(longer["history"]) == 1
    assert [row["step"] for row in read_metrics(run_copy / "metrics.jsonl")] == [1, 2, 3]


def test_a_checkpoint_past_train_steps_is_refused(run_copy, no_model_loading):
    """Guards against a checkpoint at step 2 being "resumed" by a 1-step run: nothing ran, exit 0,
    and final/ was re-exported from weights trained for another config."""
    before = _fingerprints(run_copy)
    with pytest.raises(CheckpointError, match=r"step-000002 is at step 2, beyond train.steps=1.*train.steps >= 2"):
        train_sft(_sft_cfg(run_copy, "train.steps=1"))
    assert _fingerprints(run_copy) == before


def test_a_checkpoint_with_non_finite_weights_is_refused_and_never_exported(run_copy):
    """Guards against a checkpoint whose LoRA weights are NaN, with checksums rewritten to match,
    being resumed with no step left to run and exported as an all-NaN final/ with exit 0."""
    shutil.rmtree(run_copy / "final")  # killed after the last checkpoint, before the export
    checkpoint = run_copy / "checkpoints" / "step-000002"
    weights = torch.load(checkpoint / "pytorch_model.bin", weights_only=True)
    poisoned = [key for key in weights if "lora_A" in key]
    assert poisoned
    for key in poisoned:
        weights[key] = torch.full_like(weights[key], float("nan"))
    torch.save(weights, checkpoint / "pytorch_model.bin")
    checksums = json.loads((checkpoint / "checksums.json").read_text())
    data = (checkpoint / "pytorch_model.bin").read_bytes()
    checksums["pytorch_model.bin"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "checksums.json").write_text(json.dumps(checksums))
    with pytest.raises(CheckpointError, match=r"step-000002 holds a non-finite weight \('.*lora_A.*'\)"):
        train_sft(_sft_cfg(run_copy))
    assert not (run_copy / "final").exists()


def test_resume_false_starts_over_without_mixing_the_two_runs(run_copy, capsys):
    """Guards against train.resume=false appending the new run's steps to the old metrics.jsonl
    (steps 1, 2, 1, 2) and keeping old checkpoints that a later resume would pick up."""
    result = train_sft(
        _sft_cfg(
            run_copy, "train.resume=false", "optim.lr=1e-3", "train.checkpoint_every=1", "train.keep_checkpoints=5"
        )
    )
    assert len(result["history"]) == 2
    assert [row["step"] for row in read_metrics(run_copy / "metrics.jsonl")] == [1, 2]
    assert "train.resume=false: starting over" in capsys.readouterr().out
    assert [row["optim/lr"] for row in read_metrics(run_copy / "metrics.jsonl")] == [1e-3, 1e-3]
    assert json.loads((run_copy / "run.json").read_text())["config"]["optim"]["lr"] == 1e-3


@pytest.mark.parametrize("value", ["", "''", "'  '"])
def test_an_empty_output_dir_is_an_error_naming_it(tmp_path, monkeypatch, capsys, value):
    """Guards against an empty train.output_dir writing the run into the current directory,
    overwriting a user's config.yaml there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("mine: true\n")
    args = [arg for item in [*TINY, f"train.output_dir={value}", "train.steps=1"] for arg in ("--set", item)]
    assert cli.main(["sft", *args]) == 2
    assert "train.output_dir is empty" in capsys.readouterr().err
    assert (tmp_path / "config.yaml").read_text() == "mine: true\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_an_empty_pipeline_output_dir_is_an_error_naming_it():
    """Guards against an empty output_dir writing the pipeline's stages into the current folder."""
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match="output_dir is empty"):
        load_config(PipelineConfig, None, overrides=["output_dir="])


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_output_dir_that_is_a_file_or_cannot_be_created_is_an_error_naming_it(tmp_path, capsys, where):
    """Guards against a raw FileExistsError / NotADirectoryError traceback."""
    (tmp_path / "notes.txt").write_text("not a folder")
    out = tmp_path / "notes.txt" if where == "a file" else tmp_path / "notes.txt" / "run"
    args = [arg for item in [*TINY, f"train.output_dir={out}", "train.steps=1"] for arg in ("--set", item)]
    assert cli.main(["sft", *args]) == 2
    err = capsys.readouterr().err
    expected = "is a file, not a folder" if where == "a file" else "cannot be created"
    assert f"error: train.output_dir={out} {expected}" in err and "choose another train.output_dir" in err


def test_a_pipeline_stage_killed_mid_run_and_rerun_with_another_config_names_its_section(
    run_copy, tmp_path, no_model_loading, capsys
):
    """Guards against a killed pipeline's SFT stage resuming its checkpoint under a changed `sft:`
    section (the pipeline's own DONE.json check only covers finished stages)."""
    from agentic_rl.pipeline import PipelineConfig, _run_stage

    root = tmp_path / "pipeline"
    root.mkdir()
    shutil.copytree(run_copy, root / "sft")
    if (root / "sft" / "run.json").exists():  # killed before it finished
        record = json.loads((root / "sft" / "run.json").read_text())
        (root / "sft" / "run.json").write_text(json.dumps({**record, "finished": None}))
    sft = [f"sft.{item}" for item in TINY if not item.startswith("model.name")]
    cfg = load_config(
        PipelineConfig,
        None,
        overrides=["model=tiny-qwen3", f"output_dir={root}", *sft, "sft.train.steps=2", "sft.optim.lr=1e-3"],
    )
    with pytest.raises(SystemExit) as exited:
        _run_stage(cfg, "sft")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "error: pipeline stage 'sft' (keys are those of the `sft:` section)" in err
    assert "optim.lr: 0.01 (recorded) -> 0.001 (now)" in err
    assert not (root / "sft" / "DONE.json").exists()


def _hold_lock(folder: Path) -> subprocess.Popen:
    """Another process holding `folder`'s lock, as a running launch does, until killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from agentic_rl.training.run_lock import "
            "lock_run_folder; lock_run_folder(Path(sys.argv[1])); print('locked', flush=True); time.sleep(600)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")},
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_launch_into_a_folder_in_use_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path, no_model_loading):
    """Guards against two launches into one train.output_dir both training (metrics.jsonl got 6 rows
    for 3 steps, both exited 0), and against the lock of a killed run blocking its folder for ever."""
    out = tmp_path / "run"
    out.mkdir()
    holder = _hold_lock(out)
    try:
        with pytest.raises(
            ConfigError, match=rf"train.output_dir={out} is in use by another run \(pid {holder.pid} on "
        ):
            train_sft(_sft_cfg(out))
        assert sorted(p.name for p in out.iterdir()) == [LOCK]  # refused before its record was read or written
    finally:
        holder.kill()
        holder.wait()
    try:  # the holder died: its lock is free, and the next launch gets past the folder check to the model
        with pytest.raises(AssertionError, match="a model was loaded"):
            train_sft(_sft_cfg(out))
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    finally:
        unlock_run_folder(out)


def test_a_second_pipeline_into_a_folder_in_use_is_refused_before_any_stage(tmp_path):
    """Guards against two pipelines into one output_dir racing through the same stages."""
    from agentic_rl.pipeline import PipelineConfig, run_pipeline

    holder = _hold_lock(tmp_path)
    try:
        cfg = load_config(
            PipelineConfig,
            Path(__file__).parent.parent / "configs" / "smoke.yaml",
            overrides=[f"output_dir={tmp_path}"],
        )
        with pytest.raises(
            ConfigError, match=rf"output_dir={tmp_path} is in use by another run \(pid {holder.pid} on "
        ):
            run_pipeline(cfg, log=lambda message: None)
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]
    finally:
        holder.kill()
        holder.wait()


def test_a_tilde_output_dir_is_the_home_folder_not_a_folder_named_tilde(tmp_path, monkeypatch):
    """Guards against train.output_dir=~/x making a folder named `~` in the current directory."""
    from agentic_rl.pipeline import PipelineConfig

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert _sft_cfg(Path("~/runs/x")).train.output_dir == str(tmp_path / "home" / "runs" / "x")
    assert load_config(PipelineConfig, None, overrides=["output_dir=~/runs/p"]).output_dir == str(
        tmp_path / "home" / "runs" / "p"
    )


@pytest.mark.parametrize(
    "finished", ['"yes"', '{"step": 2}', '{"step": "2", "result": {}}', '{"step": 2, "result": {"final": 7}}']
)
def test_a_corrupt_record_is_an_error_naming_the_file_and_the_way_on(run_copy, no_model_loading, finished):
    """Guards against a hand-edited or truncated run.json ending in a raw TypeError or KeyError."""
    record = json.loads((run_copy / "run.json").read_text())
    (run_copy / "run.json").write_text(json.dumps({**record, "finished": json.loads(finished)}))
    with pytest.raises(
        ConfigError, match=rf"{run_copy / 'run.json'} cannot be read \(TypeError: its finished.*train.resume=false"
    ):
        train_sft(_sft_cfg(run_copy))


def test_a_finished_record_naming_a_result_outside_its_folder_is_refused(run_copy, tmp_path, no_model_loading):
    """Guards against a record whose `final` points at another folder being returned as this run's
    result (a copied folder of old returned the original's absolute final/; an edited one, anything)."""
    elsewhere = tmp_path / "elsewhere" / "final"
    shutil.copytree(run_copy / "final", elsewhere)
    record = json.loads((run_copy / "run.json").read_text())
    assert record["finished"]["result"]["final"] == "final"  # recorded relative to the folder
    record["finished"]["result"]["final"] = str(elsewhere)
    (run_copy / "run.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=rf"names its result {elsewhere}, outside {run_copy}"):
        train_sft(_sft_cfg(run_copy))


@pytest.mark.parametrize("record", ["deleted", "edited"])
def test_a_checkpoint_resumes_only_under_the_config_that_trained_it_whatever_run_json_says(
    run_copy, no_model_loading, record
):
    """Guards against a folder whose run.json and config.yaml were deleted, or whose run.json was edited
    to the new config, resuming its checkpoint under another lr and seed ("resumed from step-000002",
    exit 0): each checkpoint carries the record of the run that wrote it."""
    shutil.rmtree(run_copy / "final")
    if record == "deleted":
        (run_copy / "run.json").unlink(), (run_copy / "config.yaml").unlink()
    else:
        forged = json.loads((run_copy / "run.json").read_text())
        forged["config"]["optim"]["lr"], forged["config"]["train"]["seed"], forged["finished"] = 1e-3, 3, None
        (run_copy / "run.json").write_text(json.dumps(forged))
    before = _fingerprints(run_copy)
    with pytest.raises(ConfigError) as caught:
        train_sft(_sft_cfg(run_copy, "train.steps=3", "optim.lr=1e-3", "train.seed=3"))
    message = str(caught.value)
    assert f"another config ({run_copy / 'checkpoints' / 'step-000002' / 'run.json'})" in message
    assert "optim.lr: 0.01 (recorded) -> 0.001 (now)" in message and "train.seed: 0 (recorded) -> 3 (now)" in message
    assert _fingerprints(run_copy) == before


def test_a_checkpoint_without_its_record_in_a_folder_without_run_json_is_refused(run_copy, no_model_loading):
    """Guards against the same resume through a checkpoint written before checkpoints carried records."""
    checkpoint = run_copy / "checkpoints" / "step-000002"
    (checkpoint / "run.json").unlink()
    checksums = json.loads((checkpoint / "checksums.json").read_text())
    del checksums["run.json"]
    (checkpoint / "checksums.json").write_text(json.dumps(checksums))
    (run_copy / "run.json").unlink(), (run_copy / "config.yaml").unlink()
    with pytest.raises(
        ConfigError, match=r"step-000002 carries no record of the config that trained it and .* has no run.json"
    ):
        train_sft(_sft_cfg(run_copy, "train.steps=3"))


def test_a_checkpoint_under_its_own_config_resumes_with_run_json_deleted(run_copy, capsys):
    """The same config is not refused: the checkpoint's record matches, and training goes on from it."""
    (run_copy / "run.json").unlink(), (run_copy / "config.yaml").unlink()
    result = train_sft(_sft_cfg(run_copy, "train.steps=3"))
    assert f"resumed from {run_copy / 'checkpoints' / 'step-000002'} at step 2" in capsys.readouterr().out
    assert len(result["history"]) == 1  # step 3 only
    assert [row["step"] for row in read_metrics(run_copy / "metrics.jsonl")] == [1, 2, 3]


def test_resume_false_refuses_a_folder_that_is_not_a_run_and_deletes_nothing(tmp_path, no_model_loading):
    """Guards against `train.resume=false` in a user's own folder deleting its config.yaml, final/ and
    checkpoints/ (and saying so only afterwards): without a run.json, nothing there is a run's."""
    folder = tmp_path / "mine"
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "weights.bin").write_bytes(b"precious")
    (folder / "checkpoints").mkdir()
    (folder / "config.yaml").write_text("my: notes\n")
    before = _fingerprints(folder)
    with pytest.raises(
        ConfigError, match=r"holds config.yaml, checkpoints, final but no run.json: it is not a run folder"
    ):
        train_sft(_sft_cfg(folder, "train.resume=false"))
    assert _fingerprints(folder) == before and (folder / "checkpoints").is_dir()


def test_a_stage_records_base_is_read_against_its_own_folder_from_any_working_directory(tmp_path, monkeypatch):
    """Guards against a stage record's `base` ("runs/sft/final", as typed) being resolved against the
    working directory: loaded from elsewhere it picked up another folder of that name. A stage base is
    recorded relative to the record, so a moved run tree follows its own chain."""
    from agentic_rl.models.stage_output import STAGE_RECORD, read_stage_record, write_stage_record

    monkeypatch.chdir(tmp_path)
    sft, grpo, plain = Path("runs/sft/final"), Path("runs/grpo/final"), tmp_path / "my-model"
    for folder in (sft, grpo, plain):
        folder.mkdir(parents=True)
    write_stage_record(sft, "lora", "tiny-qwen3")
    write_stage_record(grpo, "lora", "runs/sft/final")  # as the user named it
    assert json.loads((grpo / STAGE_RECORD).read_text())["base"] == "../../sft/final"
    write_stage_record(plain, "full", "my-model")
    assert json.loads((plain / STAGE_RECORD).read_text())["base"] == str(plain)  # a plain folder: absolute

    moved = tmp_path / "elsewhere" / "runs"
    shutil.move("runs", moved)
    decoy = tmp_path / "runs" / "sft" / "final"  # the name the user typed, now another folder
    decoy.mkdir(parents=True)
    write_stage_record(decoy, "full", "tiny-qwen3")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert read_stage_record(moved / "grpo" / "final")["base"] == str(moved / "sft" / "final")
    assert read_stage_record(moved / "sft" / "final")["base"] == "tiny-qwen3"
