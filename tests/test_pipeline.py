"""The pipeline resumes after a kill without redoing finished stages (tiny-qwen3)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CONFIG = Path(__file__).parent / "data" / "pipeline-tiny.yaml"


def _launch(out: Path, log: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "agentic_rl.cli",
        "pipeline",
        "--config",
        str(CONFIG),
        "--set",
        f"output_dir={out}",
    ]
    return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.e2e
def test_killed_pipeline_resumes_without_redoing_finished_stages(tmp_path):
    """Guards against a rerun that starts over (hours lost) or reuses a half-finished stage."""
    out = tmp_path / "run"
    first = _launch(out, tmp_path / "first.log")
    sft_done = out / "sft" / "DONE.json"
    deadline = time.time() + 240
    while not sft_done.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert sft_done.exists(), (tmp_path / "first.log").read_text()[-2000:]
    os.killpg(first.pid, signal.SIGKILL)  # dies somewhere in eval_sft / rm
    first.wait()
    assert not (out / "report.md").exists()
    finished_before = {
        stage: (out / stage / "DONE.json").stat().st_mtime_ns
        for stage in ("eval_base", "sft")
        if (out / stage / "DONE.json").exists()
    }
    assert set(finished_before) == {"eval_base", "sft"}

    second = _launch(out, tmp_path / "second.log")
    assert second.wait(timeout=400) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    assert "eval_base: already complete, skipping" in log
    assert "sft: already complete, skipping" in log
    assert "[pipeline] sft: running" not in log and "[pipeline] grpo: running" in log
    printed = json.loads(log.strip().splitlines()[-1])  # the command ends with each stage's outcome and the report
    assert printed["report"] == str(out / "report.md") and set(printed["grpo"]) >= {"final", "steps", "train_seconds"}
    assert not any("inputs" in row or "evals" in row for stage, row in printed.items() if stage != "report")
    for stage, mtime in finished_before.items():
        assert (out / stage / "DONE.json").stat().st_mtime_ns == mtime
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"eval_base", "sft", "eval_sft", "rm", "grpo", "eval_grpo", "control", "eval_control"}
    report = (out / "report.md").read_text()
    assert report.count("| arith-d1 | ") == 4 + 4 * 4  # one row per evaluated stage, one per stage pair and metric
    # The control trains SFT for GRPO's measured training time (at least one step).
    sft, grpo, control = results["sft"], results["grpo"], results["control"]
    assert control["steps"] == max(1, round(grpo["train_seconds"] / (sft["train_seconds"] / sft["steps"])))
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_reject)
    assert set(summary["stages"]) == {"eval_base", "eval_sft", "eval_grpo", "eval_control"}
    pairs = {(row["a"], row["b"], row["metric"]) for row in summary["comparisons"]}
    assert ("eval_sft", "eval_grpo", "pass@1") in pairs and ("eval_control", "eval_grpo", "sampled_accuracy@T") in pairs
    assert len(pairs) == 4 * 4
    entry = summary["stages"]["eval_grpo"]["arith-d1"]
    assert entry["n"] == 4 and len(entry["pass@1"]["ci95"]) == 2 and "solved/sometimes" in entry
    assert all(
        (out / "plots" / name).exists()
        for name in ("accuracy_by_stage.png", "reward_components.png", "length_and_variance.png")
    )
    assert not (out / "plots" / "kl.png").exists()  # grpo.loss.beta is 0: no reference pass, no KL logged

    # A rerun with another SFT config must not pass off these results as its own.
    command = [
        sys.executable,
        "-m",
        "agentic_rl.cli",
        "pipeline",
        "--config",
        str(CONFIG),
        "--set",
        f"output_dir={out}",
        "--set",
        "sft.optim.lr=0.123",
    ]
    changed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert changed.returncode != 0
    assert "stage 'sft' finished with a different config: sft changed" in changed.stderr + changed.stdout
    assert "eval_base: already complete" in changed.stdout  # its inputs (model, evals) did not change


def _reject(constant: str):
    raise ValueError(f"{constant} is not JSON")


def test_stage_inputs_follow_what_each_stage_reads():
    """A changed setting invalidates the stage that uses it and every later stage that reads its
    output, and nothing else; how a run is watched (progress bar, log interval) invalidates none."""
    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig, active_stages, stage_inputs

    base = load_config(PipelineConfig, CONFIG)

    def changed(*overrides: str) -> list[str]:
        other = load_config(PipelineConfig, CONFIG, overrides=list(overrides))
        return [stage for stage in active_stages(base) if stage_inputs(base, stage) != stage_inputs(other, stage)]

    assert changed("sft.optim.lr=0.123") == ["sft", "eval_sft", "rm", "grpo", "eval_grpo", "control", "eval_control"]
    assert changed("rm.optim.lr=0.123") == ["rm"]
    assert changed("rm.optim.lr=0.123", "grpo.reward_model.weight=0.5") == [
        "rm",
        "grpo",
        "eval_grpo",
        "control",
        "eval_control",
    ]  # the RM is a reward term (and the control matches the time of a GRPO that scores with it)
    assert changed("grpo.reward_model.weight=0.5") == ["grpo", "eval_grpo", "control", "eval_control"]
    assert changed("grpo.optim.lr=0.123") == [
        "grpo",
        "eval_grpo",
        "control",
        "eval_control",
    ]  # the control matches GRPO's time
    assert changed("control.steps=3") == ["control", "eval_control"]
    assert changed("control.seed=7") == ["control", "eval_control"]  # another control seed from the same SFT model
    assert changed("evals=[{env: {name: arith}, n: 3}]") == ["eval_base", "eval_sft", "eval_grpo", "eval_control"]
    same = "{label: arith-d1, env: {name: arith, options: {difficulty: 1}}, n: 4, k: 2, max_concurrent: 8, rollout: {max_turn_tokens: 12, max_turns: 2}}"
    assert changed(f"evals=[{same}, {{label: room, n: 2, stages: [sft]}}]") == ["eval_sft"]  # only the stage it runs at
    assert changed(f"evals=[{same}]") == []
    assert all(
        "stages" not in entry for entry in stage_inputs(base, "eval_sft")["evals"]
    )  # runs recorded before `stages` resume
    assert changed("sft.train.progress=true", "grpo.train.log_every=5", "rm.train.checkpoint_every=1") == []
    assert changed("ppo.optim.lr=0.123") == []  # PPO is not this config's RL stage
    assert changed("rl.algorithm=ppo") == [
        "control",
        "eval_control",
    ]  # grpo's stages do not run; the control matches PPO


@pytest.mark.e2e
def test_with_rl_algorithm_ppo_the_ppo_stages_replace_grpo_and_the_control_matches_ppo(tmp_path):
    """rl.algorithm: ppo runs ppo/ and eval_ppo/ instead of grpo/ and eval_grpo/; the report
    compares PPO with SFT and with the control, which is matched on PPO's training time."""
    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig, run_pipeline, stage_inputs

    cfg = load_config(
        PipelineConfig,
        CONFIG,
        overrides=[f"output_dir={tmp_path}", "rl.algorithm=ppo", "skip=[eval_base, rm]", "control.steps=1"],
    )
    assert "ppo" in stage_inputs(cfg, "control") and "grpo" not in stage_inputs(cfg, "control")
    logs: list[str] = []
    results = run_pipeline(cfg, log=logs.append)
    assert list(results) == ["sft", "eval_sft", "ppo", "eval_ppo", "control", "eval_control"]
    assert not (tmp_path / "grpo").exists() and (tmp_path / "ppo" / "final").exists()
    assert results["ppo"]["steps"] == 2 and results["ppo"]["train_seconds"] > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    pairs = {(row["a"], row["b"]) for row in summary["comparisons"]}
    assert pairs == {("eval_sft", "eval_ppo"), ("eval_sft", "eval_control"), ("eval_control", "eval_ppo")}
    assert "after PPO" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("path", sorted(str(p) for p in (Path(__file__).parent.parent / "configs").glob("*.yaml")))
def test_every_shipped_config_loads_and_validates(path):
    """Guards the configs users run first against keys or combinations the loader rejects."""
    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig

    cfg = load_config(PipelineConfig, path)
    assert cfg.evals and cfg.grpo.rollout.batch_size % cfg.grpo.rollout.group_size == 0


def test_gsm_symbolic_shows_grpo_the_prompt_its_gsm8k_sft_model_trained_with():
    """Guards configs/gsm-symbolic.yaml's copy of the gsm8k env's system prompt against drifting from
    the env's own (GRPO on gsm_symbolic would then train a GSM8K SFT model under a prompt it never saw)."""
    from agentic_rl.config import load_config
    from agentic_rl.envs.base import make_env
    from agentic_rl.pipeline import PipelineConfig

    cfg = load_config(PipelineConfig, Path(__file__).parent.parent / "configs" / "gsm-symbolic.yaml")
    gsm8k = make_env("gsm8k", tools=["calculator"]).system_prompt
    for env in (cfg.grpo.env, cfg.evals[1].env):
        assert env.name == "reasoning_gym" and env.make().system_prompt == gsm8k


EXPERIMENT_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENT_CONFIGS, ids=lambda p: p.name)
def test_every_experiment_config_names_its_command_and_loads_under_it(path):
    """Guards against an EXPERIMENTS.md row whose config no longer runs: each file under configs/experiments names
    the command that runs it (`agentic-rl <command> --config <its path>` in its header) and loads as that
    command's config, so a renamed or removed key fails here instead of in a user's rerun."""
    from agentic_rl.cli import config_class
    from agentic_rl.config import load_config

    text = path.read_text()
    commands = set(
        re.findall(rf"^#\s+agentic-rl (\w+) --config configs/experiments/{re.escape(path.name)}\b", text, re.M)
    )
    assert len(commands) == 1, (
        f"{path.name}: its header names {sorted(commands) or 'no'} command(s) that run it; name one"
    )
    load_config(config_class(commands.pop()), str(path))


@pytest.mark.parametrize("skip,fragment", [("[sft]", "'sft' cannot be skipped"), ("[grpo]", "set control.steps")])
def test_a_control_without_what_it_is_matched_on_fails_at_load(skip, fragment):
    """Guards against an honest control matched on a stage that was skipped (no SFT to start from, no GRPO time
    to match) failing hours in instead of at load."""
    from agentic_rl.config import ConfigError, load_config
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(ConfigError, match=fragment):
        load_config(PipelineConfig, CONFIG, overrides=[f"skip={skip}"])


def test_an_evaluation_runs_on_the_models_its_stages_name():
    """Guards against a pass@k evaluation meant for the SFT model alone charged to every stage, an
    evaluation stage left with nothing to evaluate, and a `stages` entry that names a model this
    pipeline never evaluates (a typo, or ppo under rl.algorithm grpo) accepted silently."""
    from agentic_rl.config import ConfigError, load_config
    from agentic_rl.pipeline import PipelineConfig, active_stages

    room = "{label: room, n: 4, k: 4, rollout: {sampling: {temperature: 1.0}}, stages: [sft]}"
    cfg = load_config(PipelineConfig, CONFIG, overrides=[f"evals=[{{label: all, n: 3}}, {room}]"])
    assert [e.name for e in cfg.evals_for("sft")] == ["all", "room"]
    assert [e.name for e in cfg.evals_for("grpo")] == [e.name for e in cfg.evals_for("base")] == ["all"]
    only_sft = load_config(PipelineConfig, CONFIG, overrides=[f"evals=[{room}]"])
    assert [s for s in active_stages(only_sft) if s.startswith("eval_")] == ["eval_sft"]
    with pytest.raises(ConfigError, match="must be a non-empty list from"):
        load_config(PipelineConfig, CONFIG, overrides=["evals=[{n: 3, stages: [sfft]}]"])
    with pytest.raises(ConfigError, match=r"evals\[0\].stages: \['ppo'\] names no model this pipeline evaluates"):
        load_config(PipelineConfig, CONFIG, overrides=["evals=[{n: 3, stages: [ppo]}]"])


def test_an_eval_cut_off_by_its_limits_warns_naming_each_limit():
    """Guards against a stage's accuracy decided by a rollout limit without a word (configs/plan.yaml's
    first run): tiny-qwen3 rambles past max_turn_tokens 4 in every episode."""
    from agentic_rl.config import load_config
    from agentic_rl.evaluation.config import EvalConfig
    from agentic_rl.pipeline import _evaluate

    cfg = load_config(
        EvalConfig, None, ["env.options={difficulty: 1}", "n=3", "max_concurrent=3", "rollout.max_turn_tokens=4"]
    )
    lines: list[str] = []
    result = _evaluate("tiny-qwen3", [cfg], lines.append)
    assert result["evals"][cfg.name]["finish_reasons"] == {"max_turn_tokens": 1.0}
    assert result["evals"][cfg.name]["decoded_in"] == "float32"  # the report says which precision decoded what
    assert any(
        "WARNING 100% of the episodes were cut off by a rollout limit (100% at max_turn_tokens 4)" in line
        for line in lines
    ), lines


def test_the_control_seed_defaults_to_a_batch_order_the_sft_stage_did_not_use():
    """Guards against a control that replays SFT's own batch order, and against a control.seed that is ignored."""
    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig, control_seed

    assert control_seed(load_config(PipelineConfig, CONFIG, overrides=["sft.train.seed=4"])) == 5
    assert control_seed(load_config(PipelineConfig, CONFIG, overrides=["sft.train.seed=4", "control.seed=11"])) == 11


def test_the_reward_model_weight_is_the_rl_sections_own_key_in_the_pipeline_as_alone():
    """Guards against two names for one setting (the pipeline's `use_reward_model`, grpo's
    `reward_model.weight`): the pipeline reads the RL section's weight and sets the path itself, refuses
    a path, a weight with the rm stage skipped, and the old key with the new one's name; alone, a weight
    without a folder stops at validation."""
    from agentic_rl.config import ConfigError, load_config
    from agentic_rl.pipeline import PipelineConfig
    from agentic_rl.training.grpo_config import GRPOConfig
    from agentic_rl.validation import load_and_validate

    assert load_config(PipelineConfig, CONFIG, ["grpo.reward_model.weight=0.5"]).grpo.reward_model.weight == 0.5
    refused = {
        "use_reward_model=0.5": "'use_reward_model' is now grpo.reward_model.weight",
        "grpo.reward_model.path=runs/rm/final": "grpo.reward_model.path is set by the pipeline",
    }
    for override, fragment in refused.items():
        with pytest.raises(ConfigError, match=re.escape(fragment)):
            load_config(PipelineConfig, CONFIG, [override])
    with pytest.raises(ConfigError, match=re.escape("grpo.reward_model.weight uses the reward model the rm stage")):
        load_config(PipelineConfig, CONFIG, ["grpo.reward_model.weight=0.5", "skip=[rm]"])
    with pytest.raises(ConfigError, match=re.escape("reward_model.weight is set but reward_model.path is empty")):
        load_and_validate(GRPOConfig, None, ["reward_model.weight=0.5"])


def test_the_tour_runs_every_stage_and_its_grpo_uses_the_trained_reward_model():
    """`make tour` (configs/smoke.yaml) is the first thing a user runs: it must skip no stage, train
    on the embedded model, and give the reward model a part in GRPO's reward."""
    from agentic_rl.config import load_config
    from agentic_rl.pipeline import PipelineConfig

    cfg = load_config(PipelineConfig, Path(__file__).parent.parent / "configs" / "smoke.yaml")
    assert cfg.skip == [] and cfg.model == "smollm2-135m-instruct" and cfg.grpo.reward_model.weight > 0
    assert cfg.rl.algorithm == "grpo" and cfg.grpo.loss.beta == 0.0
    assert "agentic-rl pipeline --config configs/smoke.yaml" in (Path(__file__).parent.parent / "Makefile").read_text()


def test_the_stage_fork_server_preloads_modules_that_exist():
    """multiprocessing skips a preload module that fails to import without a word, so a renamed
    module would quietly cost every stage its imports again (~8 s each on 2 cores)."""
    import importlib
    import multiprocessing

    from agentic_rl.pipeline_process import PRELOADED, stage_context

    for name in PRELOADED:
        importlib.import_module(name)
    assert stage_context(multiprocessing).get_start_method() == "forkserver"


_STAGE_SCRIPT = """
import multiprocessing, os, sys, time
from agentic_rl.pipeline_process import end_with_the_pipeline

def stage(pipeline_pid, path):
    end_with_the_pipeline(pipeline_pid)
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)

if __name__ == "__main__":
    worker = multiprocessing.get_context(sys.argv[2]).Process(target=stage, args=(os.getpid(), sys.argv[1]))
    worker.start()
    worker.join()
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status waits to be read


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_stage_ends_when_its_pipeline_is_killed(tmp_path, start_method):
    """Guards against a stage that outlives a killed pipeline: its parent is the fork server, so
    `kill <pipeline>` left the stage training on into its folder, unseen, sharing the cores with
    whatever ran next (an experiment queue lost 15 minutes of its two cores to one). The pipeline process here
    is killed alone (SIGKILL, not its process group), as a job scheduler or `kill -9` would; its
    stage must be gone within 20 s."""
    script, pid_file = tmp_path / "pipeline_like.py", tmp_path / "stage.pid"
    script.write_text(_STAGE_SCRIPT)
    pipeline = subprocess.Popen([sys.executable, str(script), str(pid_file), start_method], cwd=tmp_path)
    stage = None
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and pipeline.poll() is None, "the stage never started"
            time.sleep(0.2)
        stage = int(pid_file.read_text())
        assert _running(stage)
        pipeline.kill()
        pipeline.wait()
        deadline = time.monotonic() + 20
        while _running(stage) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _running(stage), "the stage outlived its pipeline"
    finally:
        if pipeline.poll() is None:
            pipeline.kill()
        if stage is not None and _running(stage):
            os.kill(stage, signal.SIGKILL)


def test_a_skipped_stage_whose_model_would_be_evaluated_is_refused_at_load():
    """Guards against `skip: [sft]` loading, then failing minutes later when eval_sft finds no
    sft/final (it did, after eval_base had run)."""
    from agentic_rl.config import ConfigError, load_config
    from agentic_rl.pipeline import PipelineConfig

    with pytest.raises(
        ConfigError,
        match=r"skip: 'sft' is skipped, so eval_sft would evaluate a model nothing trains "
        r"\(sft/final\); skip eval_sft too",
    ):
        load_config(PipelineConfig, CONFIG, ["skip=[eval_base, sft]", "control.enabled=false"])
    load_config(PipelineConfig, CONFIG, ["skip=[eval_base, sft, eval_sft]", "control.enabled=false"])


@pytest.mark.e2e
def test_a_stage_that_fails_prints_one_error_naming_the_stage_and_its_remedy(tmp_path):
    """Guards against a failed stage printing advice for the wrong source and two tracebacks (the
    stage's and the pipeline's RuntimeError): the RM stage with too few corrupted pairs stops before
    its model loads, with one error that names the stage, the count and why corrupted pairs run out."""
    command = [
        sys.executable,
        "-m",
        "agentic_rl.cli",
        "pipeline",
        "--config",
        str(CONFIG),
        "--set",
        f"output_dir={tmp_path / 'run'}",
        "--set",
        "skip=[eval_base, sft, eval_sft, grpo, eval_grpo]",
        "--set",
        "control.enabled=false",
        "--set",
        "rm.pairs.tasks=2",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 3, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: pipeline stage 'rm' (keys are those of the `rm:` section): only 2 training and 4 held-out pairs "
        "(batch_size 4); raise pairs.tasks / pairs.heldout_tasks (corrupted pairs: one per oracle demonstration that ends "
        "in a numeric `Final Answer:`; an env whose answers are not numbers gives none, and needs pairs.source=sampled)",
        "error: pipeline stage 'rm' failed (exit code 2); its error is above. Rerun the same command to resume from this stage.",
    ]
    assert "Traceback" not in completed.stderr and "trainable parameters" not in completed.stdout + completed.stderr
