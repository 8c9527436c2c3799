"""The whole seed pipeline in one command: evaluate → SFT → reward model → GRPO (or PPO) → evaluate.

    agentic-rl pipeline --config configs/demo.yaml

Run directory (`output_dir`):

    eval_base/  sft/  eval_sft/  rm/  grpo/  eval_grpo/      one folder per stage
    ppo/  eval_ppo/                                           instead of grpo/, with rl.algorithm: ppo
    control/  eval_control/                                   the compute-matched SFT control (optional)
    <stage>/DONE.json                                         written last, atomically
    report.md, plots/*.png, results.json, summary.json        the summary

The RL stage is GRPO (`grpo:`) or PPO (`ppo:`), picked by `rl.algorithm`. The control answers "would more SFT have
done as well as RL?": SFT continued from the SFT model on the same demonstrations (fresh adapters, as the RL stage
gets, and a new batch order) for as many steps as fit in the RL stage's measured training time. The report compares
every stage with the one it started from, and the RL stage with the control, on the same problems (paired, 95% CI).

A stage whose DONE.json exists is skipped on a rerun, so an interrupted pipeline resumes: a killed training stage
restarts from its newest checkpoint (the loop resumes), and finished stages are never redone. A stage ends with the
pipeline process, even when only that process is killed (`pipeline_process.end_with_the_pipeline`). DONE.json records
the config sections the stage's result depends on (its own and every earlier stage's it reads); a rerun whose config
changed one of them stops with the stage and the sections named, rather than reporting results of another config. A
training stage killed mid-run resumes from its checkpoint only with the same stage config (training/run_dir.py): a
changed one stops with each differing key of that section named; set `<stage>.train.resume=false` to redo it. Each
stage's model and output folder are set by the pipeline from `model` and `output_dir`; setting them inside a stage
section is an error.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from agentic_rl.config import Config, ConfigError, NonNegativeInt, refuse_unused
from agentic_rl.errors import RunStopped
from agentic_rl.evaluation.config import EvalConfig
from agentic_rl.evaluation.report import write_report
from agentic_rl.evaluation.runner import TRUNCATED, evaluate
from agentic_rl.integrations.backends import train_grpo_with_backend
from agentic_rl.models.device import load_for_decoding, resolve_device
from agentic_rl.pipeline_eta import progress_line
from agentic_rl.pipeline_process import end_with_the_pipeline, stage_context
from agentic_rl.plugin_loading import load_plugins
from agentic_rl.plugins import PluginError, PluginsConfig
from agentic_rl.strict_json import dumps, read_json, write_json
from agentic_rl.training.episode_config import RewardModelTerm
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.training.ppo import train_ppo
from agentic_rl.training.ppo_config import PPOConfig
from agentic_rl.training.reward_model import RMConfig, train_rm
from agentic_rl.training.metrics_file import read_metrics
from agentic_rl.training.run_dir import RunDir, usable_output_dir
from agentic_rl.training.run_lock import lock_run_folder, unlock_run_folder
from agentic_rl.training.run_record import LOOP_KEYS_WITHOUT_EFFECT
from agentic_rl.training.sft import SFTConfig, train_sft

STAGES = ("eval_base", "sft", "eval_sft", "rm", "grpo", "eval_grpo", "ppo", "eval_ppo", "control", "eval_control")
RL_STAGES = {"grpo": ("grpo", "eval_grpo"), "ppo": ("ppo", "eval_ppo")}
"""The stages of each RL algorithm; only rl.algorithm's run."""
MODELS = ("base", "sft", "grpo", "ppo", "control")
"""The models the pipeline evaluates: stage eval_<model> evaluates <model>."""


@dataclasses.dataclass
class PipelineEvalConfig(EvalConfig):
    """One of the pipeline's evaluations: an `agentic-rl eval` section, and the models it runs on."""

    stages: list[str] | None = None
    """The models this evaluation runs on, from base, sft, grpo, ppo, control; null: every model the
    pipeline evaluates. E.g. a sampled pass@k evaluation of the SFT model alone asks whether there is
    room for RL (problems it solves sometimes) without paying for k samples at every stage."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stages is not None and (not self.stages or set(self.stages) - set(MODELS)):
            raise ValueError(
                f"stages: {self.stages!r} must be a non-empty list from {list(MODELS)}, or null for every model"
            )

    def runs_on(self, model: str) -> bool:
        return self.stages is None or model in self.stages


_REDO_STAGE = "delete the stage's folder to run that stage again (a rerun resumes from the stages before it)"


@dataclasses.dataclass
class RLConfig(Config):
    """Which RL algorithm the pipeline's RL stage runs."""

    algorithm: Literal["grpo", "ppo"] = "grpo"
    """grpo: the `grpo:` section (no value model); ppo: the `ppo:` section (a value model and GAE)."""


@dataclasses.dataclass
class ControlConfig(Config):
    """The compute-matched control: more SFT instead of GRPO."""

    enabled: bool = False
    """Run it (stages control and eval_control)."""
    steps: NonNegativeInt = 0
    """SFT steps of the control; 0: as many as fit in GRPO's measured training time (the sum of
    GRPO's step times, rollouts included, over the SFT stage's mean step time)."""
    seed: int | None = None
    """Seed of the control's fresh adapters and batch order; None: sft.train.seed + 1 (a batch
    order the SFT stage did not use). Set it to repeat the control over seeds from one SFT model."""

    def __post_init__(self) -> None:
        if not self.enabled:
            refuse_unused(
                self,
                ["steps", "seed"],
                prefix="control.",
                used_with="control.enabled: true",
                now="control.enabled is false",
            )


@dataclasses.dataclass
class PipelineConfig(PluginsConfig):
    """`agentic-rl pipeline`: every stage of the seed pipeline, in order."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "use_reward_model": "grpo.reward_model.weight (or ppo's), the key `agentic-rl grpo` reads; "
        "the pipeline sets its path to the rm stage's model"
    }

    model: str = "smollm2-135m-instruct"
    """Base model for every stage (built-in name, local directory or hub id)."""
    output_dir: str = "runs/demo"
    """Run directory (`~` expanded); each stage writes a subfolder. One pipeline at a time: a second
    launch into it is refused while the first runs."""
    evals: list[PipelineEvalConfig] = dataclasses.field(default_factory=lambda: [PipelineEvalConfig()])
    """Evaluations of the base model and of each trained one (each entry's `stages` says which)."""
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
    """SFT stage (model.name and train.output_dir are set by the pipeline)."""
    rm: RMConfig = dataclasses.field(default_factory=RMConfig)
    """Reward-model stage."""
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)
    """The RL stage's algorithm."""
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    """GRPO stage (rl.algorithm: grpo); starts from the SFT model."""
    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    """PPO stage (rl.algorithm: ppo); starts from the SFT model."""
    control: ControlConfig = dataclasses.field(default_factory=ControlConfig)
    """The compute-matched SFT control (off by default: it costs as much as GRPO)."""
    skip: list[str] = dataclasses.field(default_factory=list)
    """Stages to skip, from: eval_base, sft, eval_sft, rm, grpo, eval_grpo, ppo, eval_ppo (only
    rl.algorithm's RL stages run; control and eval_control only when control.enabled)."""

    def __post_init__(self) -> None:
        self.evals = [
            entry
            if isinstance(entry, PipelineEvalConfig)
            # an EvalConfig built in Python: every model
            else PipelineEvalConfig(**{f.name: getattr(entry, f.name) for f in dataclasses.fields(EvalConfig)})
            for entry in self.evals
        ]
        if not self.output_dir.strip():
            raise ValueError(
                "output_dir is empty; set it to a folder for the pipeline's stages (e.g. runs/demo): an empty "
                "path would write them into the current directory"
            )
        self.output_dir = os.path.expanduser(self.output_dir)  # `~/runs/x`, not a folder named `~` in the cwd
        unknown = sorted(set(self.skip) - set(STAGES))
        if unknown:
            raise ValueError(f"skip: unknown stage(s) {unknown}; stages are {list(STAGES)}")
        defaults = {"sft": SFTConfig(), "rm": RMConfig(), "grpo": GRPOConfig(), "ppo": PPOConfig()}
        for name, stage in (("sft", self.sft), ("rm", self.rm), ("grpo", self.grpo), ("ppo", self.ppo)):
            if stage.model.name != defaults[name].model.name:
                raise ValueError(
                    f"{name}.model.name is set by the pipeline (from `model` and earlier stages); remove it"
                )
            if stage.train.output_dir != defaults[name].train.output_dir:
                raise ValueError(f"{name}.train.output_dir is set by the pipeline (output_dir/{name}); remove it")
            if stage.plugins:
                raise ValueError(
                    f"{name}.plugins: list plugins at the top level (`plugins:`), where every stage imports them"
                )
        if self.control.enabled and "sft" in self.skip:
            raise ValueError("control.enabled: the control continues the SFT stage's model, so 'sft' cannot be skipped")
        rl = self.rl.algorithm
        if self.control.enabled and not self.control.steps and rl in self.skip:
            raise ValueError(
                f"control.steps: 0 matches the RL stage's measured training time, but '{rl}' is skipped; set control.steps"
            )
        for name, stage in (("grpo", self.grpo), ("ppo", self.ppo)):
            if stage.reward_model.path:
                raise ValueError(
                    f"{name}.reward_model.path is set by the pipeline (its rm stage's model); set only "
                    f"{name}.reward_model.weight"
                )
        if getattr(self, rl).reward_model.weight and "rm" in self.skip:
            raise ValueError(
                f"{rl}.reward_model.weight uses the reward model the rm stage trains, but 'rm' is skipped; "
                f"remove it from skip, or set {rl}.reward_model.weight: 0"
            )
        thinking = {
            "sft.enable_thinking": self.sft.enable_thinking,
            "rm.pairs.rollout.enable_thinking": self.rm.pairs.rollout.enable_thinking,
            f"{rl}.rollout.enable_thinking": getattr(self, rl).rollout.enable_thinking,
            **{f"evals[{i}].rollout.enable_thinking": e.rollout.enable_thinking for i, e in enumerate(self.evals)},
        }
        if len(set(thinking.values())) > 1:
            raise ValueError(
                "enable_thinking differs between the stages of one model ("
                + ", ".join(f"{k}={v}" for k, v in thinking.items())
                + "): demonstrations, episodes and evaluations would be rendered in different modes; set one value in each"
            )
        evaluated = {stage.removeprefix("eval_") for stage in active_stages(self) if stage.startswith("eval_")}
        for model in sorted(evaluated & set(self.skip)):  # sft, grpo, ppo or control: a model no stage makes
            raise ValueError(
                f"skip: '{model}' is skipped, so eval_{model} would evaluate a model nothing trains "
                f"({model}/final); skip eval_{model} too, or run '{model}'"
            )
        for index, entry in enumerate(self.evals):
            if entry.stages is not None and not set(entry.stages) & evaluated:
                raise ValueError(
                    f"evals[{index}].stages: {entry.stages} names no model this pipeline evaluates ({sorted(evaluated)}); "
                    "name one of those, or remove the entry"
                )
        devices = sorted({e.rollout.device for e in self.evals})
        if len(devices) > 1:
            raise ValueError(
                f"evals[].rollout.device: the evaluations of a stage share one loaded model, so one device, "
                f"got {devices}; give every entry the same device"
            )

    def evals_for(self, model: str) -> list[PipelineEvalConfig]:
        """The evaluations stage eval_<model> runs."""
        return [entry for entry in self.evals if entry.runs_on(model)]


def _log(message: str) -> None:
    print(message, flush=True)


def run_pipeline(cfg: PipelineConfig, log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Run every stage not yet done, each in a fresh process; write the report; return the results.

    A stage runs in its own fresh process (see `pipeline_process.stage_context`) so the memory of its models,
    optimizer states and KV caches is returned to the system when it ends; one process for all
    stages grew past 20 GB on the demo and was killed by the OOM killer.
    """
    root = usable_output_dir(cfg.output_dir, "output_dir")
    lock_run_folder(root, "output_dir")  # one pipeline per folder; each stage locks its own subfolder
    try:
        return _run_stages(cfg, root, log)
    finally:
        unlock_run_folder(root)


def _run_stages(cfg: PipelineConfig, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    _check_devices(cfg)
    recorded = False  # config.yaml is written once the finished stages are known to match this config
    results: dict[str, Any] = {}
    context = stage_context(multiprocessing)
    stages = active_stages(cfg)
    started = time.perf_counter()
    for index, stage in enumerate(stages):
        done = root / stage / "DONE.json"
        if done.exists():
            results[stage] = read_json(done, _REDO_STAGE)
            _check_unchanged(cfg, stage, results[stage], done)
            log(f"[pipeline] {stage}: already complete, skipping")
            continue
        if not recorded:
            RunDir(root, cfg, tensorboard=False)  # records the resolved config
            recorded = True
        log(f"[pipeline] {stage}: running")
        worker = context.Process(target=_run_stage, args=(cfg, stage, os.getpid()), name=f"agentic-rl-{stage}")
        worker.start()
        worker.join()
        if worker.exitcode != 0 or not done.exists():  # the stage printed its own error
            raise RunStopped(
                f"pipeline stage '{stage}' failed (exit code {worker.exitcode}); its error is above. "
                "Rerun the same command to resume from this stage."
            )
        results[stage] = read_json(done, _REDO_STAGE)
        log(
            progress_line(
                cfg, stage, results[stage]["seconds"], time.perf_counter() - started, results, stages[index + 1 :]
            )
        )
    if not recorded:
        RunDir(root, cfg, tensorboard=False)

    report = write_report(root, results, cfg)
    log(f"[pipeline] report: {report}")
    return results


def _check_devices(cfg: PipelineConfig) -> None:
    """Resolve the devices the stages will load models on: a missing GPU stops the run now, not later."""
    for index, eval_cfg in enumerate(cfg.evals):
        resolve_device(eval_cfg.rollout.device, f"evals[{index}].rollout.device")
    if cfg.rm.pairs.source == "sampled":
        resolve_device(cfg.rm.pairs.rollout.device, "rm.pairs.rollout.device")


def active_stages(cfg: PipelineConfig) -> list[str]:
    """The stages this config runs, in order: not skipped, rl.algorithm's RL stages only, the
    control only when enabled, and an evaluation only where one of `evals` runs on its model."""
    other_rl = {s for name, stages in RL_STAGES.items() if name != cfg.rl.algorithm for s in stages}
    return [
        stage
        for stage in STAGES
        if stage not in cfg.skip
        and stage not in other_rl
        and (cfg.control.enabled or stage not in ("control", "eval_control"))
        and not (stage.startswith("eval_") and not cfg.evals_for(stage.removeprefix("eval_")))
    ]


def _run_stage(cfg: PipelineConfig, stage: str, pipeline_pid: int | None = None) -> None:
    """Body of one stage's process: import the plugins, run the stage, write its DONE.json atomically.

    A stage process starts with none of the parent's plugins (the fork server imported only the
    toolkit), so the envs, tools and rewards of `cfg.plugins` are registered here, before the stage
    builds its first env. Run as the pipeline's child (pipeline_pid given), it ends with the
    pipeline (`end_with_the_pipeline`)."""
    if pipeline_pid is not None:
        end_with_the_pipeline(pipeline_pid)

    try:  # the pipeline command validated the whole config; a stage's process only imports its plugins
        load_plugins(cfg.plugins)
    except PluginError as exc:
        print(f"error: pipeline stage '{stage}': {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    root = Path(cfg.output_dir)
    models = {
        "base": cfg.model,
        "sft": str(root / "sft" / "final"),
        "grpo": str(root / "grpo" / "final"),
        "ppo": str(root / "ppo" / "final"),
        "control": str(root / "control" / "final"),
    }
    actions: dict[str, Callable[[], dict[str, Any]]] = {
        "eval_base": lambda: _evaluate(models["base"], cfg.evals_for("base"), _log),
        "sft": lambda: _sft(cfg, root, _log),
        "eval_sft": lambda: _evaluate(models["sft"], cfg.evals_for("sft"), _log),
        "rm": lambda: _rm(cfg, root, models["sft"], _log),
        "grpo": lambda: _rl(cfg, root, models["sft"], "grpo"),
        "eval_grpo": lambda: _evaluate(models["grpo"], cfg.evals_for("grpo"), _log),
        "ppo": lambda: _rl(cfg, root, models["sft"], "ppo"),
        "eval_ppo": lambda: _evaluate(models["ppo"], cfg.evals_for("ppo"), _log),
        "control": lambda: _control(cfg, root, models["sft"], _log),
        "eval_control": lambda: _evaluate(models["control"], cfg.evals_for("control"), _log),
    }
    started = time.perf_counter()
    try:
        result = actions[stage]()
    except (ConfigError, RunStopped, ValueError) as exc:  # e.g. another config's run, too few RM pairs
        section = f" (keys are those of the `{stage}:` section)" if stage in ("sft", "rm", "grpo", "ppo") else ""
        print(f"error: pipeline stage '{stage}'{section}: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    result["seconds"] = time.perf_counter() - started
    result["inputs"] = stage_inputs(cfg, stage)
    _write_atomic(root / stage / "DONE.json", result)


def stage_inputs(cfg: PipelineConfig, stage: str) -> dict[str, Any]:
    """The config sections a stage's result depends on (JSON-ready): its own, and those of the
    stages whose output it reads (the SFT model feeds everything after SFT)."""
    sections = {
        "eval_base": ["model", "evals"],
        "sft": ["model", "sft"],
        "eval_sft": ["model", "sft", "evals"],
        "rm": ["model", "sft", "rm"],
        "grpo": ["model", "sft", "grpo"],
        "eval_grpo": ["model", "sft", "grpo", "evals"],
        "ppo": ["model", "sft", "ppo"],
        "eval_ppo": ["model", "sft", "ppo", "evals"],
        "control": ["model", "sft", cfg.rl.algorithm, "control"],
        "eval_control": ["model", "sft", cfg.rl.algorithm, "control", "evals"],
    }[stage]
    if (
        stage in ("grpo", "eval_grpo", "ppo", "eval_ppo")
        and getattr(cfg, stage.removeprefix("eval_")).reward_model.weight
    ):
        sections.append("rm")
    as_dict = dataclasses.asdict(cfg)
    if stage.startswith("eval_"):  # the evaluations this stage runs, as they were before `stages` existed
        as_dict["evals"] = [
            {k: v for k, v in dataclasses.asdict(e).items() if k != "stages"}
            for e in cfg.evals_for(stage.removeprefix("eval_"))
        ]
    for name in ("sft", "rm", "grpo", "ppo"):  # how a run is watched and saved does not change its result
        for key in LOOP_KEYS_WITHOUT_EFFECT:
            as_dict[name]["train"].pop(key.removeprefix("train."), None)
    return json.loads(dumps({name: as_dict[name] for name in sections}))


def _check_unchanged(cfg: PipelineConfig, stage: str, result: dict[str, Any], done: Path) -> None:
    recorded, now = result.get("inputs"), stage_inputs(cfg, stage)
    if recorded is None or recorded == now:
        return
    changed = sorted(name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name))
    later = list(STAGES[STAGES.index(stage) :])
    raise ConfigError(
        f"stage '{stage}' finished with a different config: {', '.join(changed)} changed since {done} was written. "
        f"Its results would not match this config. Delete the folders of {later} under {done.parent.parent} "
        "to redo them, or set another output_dir."
    )


def _write_atomic(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, payload)


def _evaluate(model_name: str, evals: list[EvalConfig], log) -> dict[str, Any]:
    device = evals[0].rollout.device if evals else "auto"  # one device for all: PipelineConfig checks
    model, tokenizer, _ = load_for_decoding(model_name, device, "evals[0].rollout.device")
    out = {}
    for eval_cfg in evals:
        label = eval_cfg.name
        out[label] = evaluate(model, tokenizer, eval_cfg)
        result, interval, k = out[label], out[label]["ci95"]["pass@1"], out[label]["k"]
        sampled = (
            f", sampled accuracy {result['sampled_accuracy@T']:.3f}, pass@{k} {result[f'pass@{k}']:.3f}"
            if k > 1
            else ""
        )
        log(
            f"[pipeline]   {label}: pass@1 = {result['pass@1']:.3f} [{interval[0]:.3f}, {interval[1]:.3f}] on {result['n']} problems{sampled}"
        )
        if result["truncated_rate"] > 0.1:
            limits = ", ".join(
                f"{share:.0%} at {reason} {getattr(eval_cfg.rollout, reason)}"
                for reason, share in result["finish_reasons"].items()
                if reason in TRUNCATED
            )
            log(
                f"[pipeline]   {label}: WARNING {result['truncated_rate']:.0%} of the episodes were cut off by a rollout limit "
                f"({limits}): a model that rambles hits max_turn_tokens; one that cannot finish in time, the others "
                "(raise them in this eval's rollout section)"
            )
    return {"model": model_name, "evals": out}


def _sft(cfg: PipelineConfig, root: Path, log) -> dict[str, Any]:
    sft = dataclasses.replace(
        cfg.sft,
        model=dataclasses.replace(cfg.sft.model, name=cfg.model),
        train=dataclasses.replace(cfg.sft.train, output_dir=str(root / "sft")),
    )
    out = train_sft(sft)
    return {
        "final": out["final"],
        "num_demos": out["num_demos"],
        "steps": cfg.sft.train.steps,
        "final_loss": out["history"][-1]["loss/total"] if out["history"] else None,
        "train_seconds": training_seconds(root / "sft", cfg.sft.train.steps),
    }


def training_seconds(run: Path, steps: int) -> float:
    """Wall time of a run's `steps` optimizer steps (data with rollouts, forward/backward and
    optimizer), without model loading or saving: the budget the control is matched on. Read from
    the run's metrics.jsonl, so a resumed run counts its steps before the resume too; with
    train.log_every > 1, the logged steps' mean times the step count."""
    rows = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    times = [
        row.get("time/data", 0.0) + row.get("time/forward_backward", 0.0) + row.get("time/optimizer", 0.0)
        for row in rows
    ]
    return float(sum(times) / len(times) * steps) if times else 0.0


def _control(cfg: PipelineConfig, root: Path, sft_model: str, log) -> dict[str, Any]:
    steps = cfg.control.steps
    if not steps:
        sft_done, rl_done = (read_json(root / name / "DONE.json", _REDO_STAGE) for name in ("sft", cfg.rl.algorithm))
        per_step = sft_done["train_seconds"] / max(1, sft_done["steps"])
        steps = max(1, round(rl_done["train_seconds"] / per_step))
        log(
            f"[pipeline]   control: {cfg.rl.algorithm.upper()} trained {rl_done['train_seconds']:.0f} s; "
            f"SFT takes {per_step:.1f} s per step -> {steps} steps"
        )
    control = dataclasses.replace(
        cfg.sft,
        model=dataclasses.replace(cfg.sft.model, name=sft_model),
        train=dataclasses.replace(cfg.sft.train, steps=steps, seed=control_seed(cfg), output_dir=str(root / "control")),
    )
    out = train_sft(control)
    return {
        "final": out["final"],
        "steps": steps,
        "final_loss": out["history"][-1]["loss/total"] if out["history"] else None,
        "train_seconds": training_seconds(root / "control", steps),
    }


def control_seed(cfg: PipelineConfig) -> int:
    """The control's seed: control.seed, else sft.train.seed + 1."""
    return cfg.sft.train.seed + 1 if cfg.control.seed is None else cfg.control.seed


def _rm(cfg: PipelineConfig, root: Path, sft_model: str, log) -> dict[str, Any]:
    pairs = cfg.rm.pairs
    if pairs.source == "sampled" and not pairs.policy:
        pairs = dataclasses.replace(pairs, policy=sft_model)
    rm = dataclasses.replace(
        cfg.rm,
        model=dataclasses.replace(cfg.rm.model, name=cfg.model),
        pairs=pairs,
        train=dataclasses.replace(cfg.rm.train, output_dir=str(root / "rm")),
    )
    return train_rm(rm)


def _rl(cfg: PipelineConfig, root: Path, sft_model: str, algorithm: str) -> dict[str, Any]:
    """The RL stage (GRPO or PPO) from the SFT model, with the trained reward model as a term if asked."""
    section = getattr(cfg, algorithm)
    start = sft_model if "sft" not in cfg.skip else cfg.model
    weight = section.reward_model.weight
    term = RewardModelTerm(path=str(root / "rm" / "final"), weight=weight) if weight else RewardModelTerm()
    stage = dataclasses.replace(
        section,
        model=dataclasses.replace(section.model, name=start),
        reward_model=term,
        train=dataclasses.replace(section.train, output_dir=str(root / algorithm)),
    )
    if algorithm == "grpo":
        out = train_grpo_with_backend(stage)
    else:
        out = train_ppo(stage)
    history = out["history"]
    return {
        "final": out["final"],
        "steps": len(history),
        "reward_first": history[0].get("reward/total/mean") if history else None,
        "reward_last": history[-1].get("reward/total/mean") if history else None,
        "train_seconds": training_seconds(root / algorithm, section.train.steps),
    }
