"""The config loader is strict: every key is used or rejected (docs/design.md invariant 6)."""

import dataclasses
import re
import subprocess
import sys
from typing import Literal

import pytest

from agentic_rl.config import ConfigError, load_config
from agentic_rl.config_docs import describe


@dataclasses.dataclass
class Optim:
    lr: float = 1e-5
    """Peak learning rate."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Schedule after warm-up."""


@dataclasses.dataclass
class Example:
    model: str = "tiny-qwen3"
    """Model name or path."""
    steps: int = 10
    """Optimizer steps."""
    lora: bool = True
    """Use LoRA."""
    tags: list[str] = dataclasses.field(default_factory=list)
    """Free-form tags."""
    optim: Optim = dataclasses.field(default_factory=Optim)
    """Optimizer settings."""


def test_yaml_and_overrides_are_applied_in_order(tmp_path):
    """Guards against overrides that lose to the YAML file, or that replace a whole section instead of one key."""
    path = tmp_path / "c.yaml"
    path.write_text("steps: 20\noptim:\n  lr: 3e-4\n  schedule: cosine\n")
    cfg = load_config(Example, path, overrides=["optim.lr=1e-3", "tags=[a, b]"])
    assert cfg.steps == 20
    assert cfg.optim.lr == pytest.approx(1e-3)
    assert cfg.optim.schedule == "cosine"
    assert cfg.tags == ["a", "b"]


def test_yaml_exponent_without_dot_is_a_float(tmp_path):
    """Guards against YAML 1.1 reading `3e-4` as the string '3e-4'."""
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 3e-4\n")
    assert load_config(Example, path).optim.lr == pytest.approx(3e-4)


def test_unknown_key_names_the_key_and_allowed_keys(tmp_path):
    """Guards against silently ignored settings (the seed ignored 11 documented keys)."""
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError) as info:
        load_config(Example, path)
    message = str(info.value)
    assert "optim.learning_rate" in message and "lr, schedule" in message and str(path) in message


def test_literal_value_error_lists_allowed_values():
    """Guards against a typo'd choice accepted or refused without the allowed values (invariant 6: every setting
    is used or rejected)."""
    with pytest.raises(ConfigError, match=r"'optim.schedule' must be one of \['constant', 'cosine'\], got 'linear'"):
        load_config(Example, overrides=["optim.schedule=linear"])


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("steps=ten", "'steps' must be an integer"),
        ("lora=maybe", "'lora' must be true or false"),
        ("steps=1.5", "'steps' must be an integer"),
    ],
)
def test_wrong_types_are_rejected_with_the_key(override, fragment):
    """Guards against a value of the wrong type coerced silently (1.5 steps, 'maybe' as a bool): the error names
    the key and the expected type."""
    with pytest.raises(ConfigError, match=fragment):
        load_config(Example, overrides=[override])


def test_describe_lists_every_leaf_key_with_its_docstring():
    """Guards against `agentic-rl config` help that drifts from the dataclasses: every leaf key is listed once
    with its type, default and docstring."""
    lines = describe(Example)
    assert any(line.startswith("optim.lr (float, default 1e-05): Peak learning rate.") for line in lines)
    assert len(lines) == 6


def test_the_reference_shows_choices_optionals_and_list_defaults_as_a_config_writes_them():
    """Guards against `agentic-rl config` printing `Literal` with no choices and list items as Python
    reprs (`[RewardSpec(name='env_steps', ...)]`), which a user cannot copy into a config."""
    from agentic_rl.training.grpo_config import GRPOConfig

    lines = {line.split(" (", 1)[0]: line for line in describe(GRPOConfig)}
    assert lines["model.dtype"].startswith("model.dtype (one of float32, bfloat16, float16, default 'float32'): ")
    assert lines["rollout.enable_thinking"].startswith("rollout.enable_thinking (bool or null, default None): ")
    assert lines["rewards"].startswith(
        "rewards (list of RewardSpec, default [{name: env_steps, weight: 1.0, params: {}}]): "
    )


def test_the_reference_lists_the_fields_of_list_items_and_only_user_facing_text():
    """Guards against `sources`, `evals` and `rewards` documented only as a default's repr (what may
    an item hold?), and against field docs carrying benchmark dates and measurements a user cannot
    act on (they belong in BENCHMARKS.md and EXPERIMENTS.md)."""
    import re

    from agentic_rl.train_commands import CONFIGURED_COMMANDS, config_class

    sft = [line.split(" (", 1)[0] for line in describe(config_class("sft"))]
    assert sft[sft.index("sources") : sft.index("sources") + 8] == [
        "sources",
        "sources[].kind",
        "sources[].env.name",
        "sources[].env.options",
        "sources[].split",
        "sources[].n",
        "sources[].path",
        "sources[].max_repeats",
    ]
    pipeline = {line.split(" (", 1)[0] for line in describe(config_class("pipeline"))}
    assert {"evals[].label", "evals[].rollout.max_turns", "grpo.rewards[].params", "sft.sources[].path"} <= pipeline
    for command in CONFIGURED_COMMANDS:
        for line in describe(config_class(command)):
            assert not re.search(r"\b20\d\d-\d\d-\d\d\b|measured on|2-core|\bVM\b|benchmarks/", line), (command, line)


def test_malformed_override_is_explained():
    """Guards against an override without '=' failing deep inside, or being ignored: the error says the
    key=value form."""
    with pytest.raises(ConfigError, match="must look like key.subkey=value"):
        load_config(Example, overrides=["steps"])


@dataclasses.dataclass
class Stage:
    optim: Optim = dataclasses.field(default_factory=lambda: Optim(lr=3e-4, schedule="cosine"))
    """Optimizer with a stage-specific default."""
    options: dict = dataclasses.field(default_factory=lambda: {"a": 1, "b": 2})
    """Free options."""


@dataclasses.dataclass
class Outer:
    stage: Stage = dataclasses.field(default_factory=Stage)
    """A nested stage."""


def test_partial_section_keeps_the_fields_own_defaults():
    """Guards against `optim: {lr: 1e-3}` silently resetting schedule to the class default."""
    cfg = load_config(Outer, overrides=["stage.optim.lr=1e-3"])
    assert cfg.stage.optim.lr == pytest.approx(1e-3)
    assert cfg.stage.optim.schedule == "cosine"


def test_dict_valued_options_are_replaced_not_merged():
    """Guards against a dict override that merges with the default, leaving keys the user meant to remove."""
    cfg = load_config(Outer, overrides=["stage.options={c: 3}"])
    assert cfg.stage.options == {"c": 3}


@dataclasses.dataclass
class Precision:
    mixed_precision: Literal["no", "bf16"] = "bf16"
    """Autocast precision."""


def test_yaml_no_is_the_literal_string_when_the_choices_say_so():
    """Guards against `--set train.mixed_precision=no` failing because YAML 1.1 reads `no` as False."""
    assert load_config(Precision, overrides=["mixed_precision=no"]).mixed_precision == "no"


def test_sampling_logprobs_are_pi_old_only_when_rollout_decodes_in_the_models_dtype():
    """old_logprobs=sampling needs the rollout to sample from the trained weights themselves: a
    bf16 decode of a float32 model is refused with what to set; bf16 with bf16 is allowed."""
    from agentic_rl.training.grpo_config import GRPOConfig

    with pytest.raises(ValueError, match=r"rollout\.dtype=bfloat16.*float32 model.*old_logprobs: detach"):
        load_config(GRPOConfig, None, overrides=["rollout.dtype=bfloat16"])
    cfg = load_config(GRPOConfig, None, overrides=["rollout.dtype=bfloat16", "model.dtype=bfloat16"])
    assert cfg.old_logprobs == "sampling"
    with pytest.raises(ValueError, match=r"rollout\.dtype=float32.*bfloat16 model"):
        load_config(GRPOConfig, None, overrides=["model.dtype=bfloat16"])
    assert (
        load_config(GRPOConfig, None, overrides=["model.dtype=bfloat16", "old_logprobs=recompute"]).rollout.dtype
        == "float32"
    )


def test_every_command_prints_its_help_without_loading_torch():
    """Guards against a help text argparse cannot format (a bare % once crashed `agentic-rl --help`),
    and against help that imports torch (it must be instant)."""
    import subprocess
    import sys

    from agentic_rl.cli import build_parser

    commands = [[]] + [[name] for name in build_parser()._subparsers._group_actions[0].choices]
    script = (
        "import sys; from agentic_rl.cli import build_parser; p = build_parser()\n"
        "for argv in %r:\n"
        "    try: p.parse_args(argv + ['--help'])\n"
        "    except SystemExit as e: assert e.code == 0, argv\n"
        "assert 'torch' not in sys.modules, 'help imported torch'\n" % commands
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@dataclasses.dataclass
class StageOptim(Optim):
    """Optim with a stage's own defaults, declared where describe reads them."""

    lr: float = 3e-4
    schedule: Literal["constant", "cosine"] = "cosine"


@dataclasses.dataclass
class DeclaredStage:
    optim: StageOptim = dataclasses.field(default_factory=StageOptim)
    """Optimizer with a stage-specific default."""


def test_describe_and_field_help_show_a_sections_own_defaults_not_its_class_defaults():
    """Guards against `agentic-rl config grpo` printing LoopConfig's steps 100 where GRPO's are 50,
    and against a default hidden in a factory, where describe cannot read it without building it."""
    from agentic_rl.config_docs import field_help

    lines = describe(DeclaredStage)
    assert "optim.lr (float, default 0.0003): Peak learning rate." in lines, lines
    assert any(line.startswith("optim.schedule (one of constant, cosine, default 'cosine')") for line in lines), lines
    assert field_help(DeclaredStage, "optim.lr").endswith("(default 0.0003)")
    with pytest.raises(TypeError, match=r"Stage.optim: a section's default must be default_factory=Optim"):
        describe(Stage)


def _leaves(config, prefix=""):
    """{dotted key: value} of every leaf of a config instance."""
    leaves = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            leaves.update(_leaves(value, f"{prefix}{field.name}."))
        else:
            leaves[f"{prefix}{field.name}"] = value
    return leaves


@pytest.mark.parametrize("command", ["grpo", "ppo", "sft", "rm", "audit", "chat"])
def test_agentic_rl_config_lists_every_key_once_with_the_default_a_run_gets(command, capsys):
    """Guards against `agentic-rl config` showing a class default that the command's own default
    replaces (LoopConfig's steps 100 and runs/train, never a command's), a key twice, or a key
    missing; each shown default must be the one the config gets when the key is not set."""
    from agentic_rl.cli import main
    from agentic_rl.train_commands import config_class

    assert main(["config", command]) == 0
    lines = capsys.readouterr().out.splitlines()
    lines = [
        line for line in lines if "[]." not in line.split(" ", 1)[0]
    ]  # a list item's fields: not keys of their own
    keys = [line.split(" ", 1)[0] for line in lines]
    assert len(keys) == len(set(keys)), [key for key in keys if keys.count(key) > 1]
    required = ["model=tiny-qwen3"] if command in ("audit", "chat") else []
    built = _leaves(load_config(config_class(command), None, required))
    built.pop("loss.max_completion_length", None)  # derived, not a key
    assert sorted(keys) == sorted(built)
    from agentic_rl.config_docs import _shown_default

    for line, key in zip(lines, keys):
        if key != "model" or not required:
            assert f", default {_shown_default(built[key])}): " in line, (line, built[key])


# ------------------------------------------------------------------ checks at construction

_BAD_VALUES = [  # (command, dotted key, bad value as --set writes it, the same value in Python)
    ("grpo", "micro_batch_size", "0", 0),
    ("grpo", "rollout.max_turns", "0", 0),
    ("grpo", "rollout.sampling.top_k", "-1", -1),
    ("grpo", "loss.loss_type", "ppo", "ppo"),
    ("grpo", "rollout_correction.mode", "weird", "weird"),
    ("ppo", "loss.kl_mode", "both", "both"),
    ("ppo", "value.lr_multiplier", ".nan", float("nan")),
    ("sft", "micro_batch_size", "0", 0),
    ("sft", "train.steps", "-1", -1),
    ("rm", "optim.lr", "0", 0),
    ("serve", "http.max_body_bytes", "0", 0),
    ("pipeline", "control.steps", "-2", -2),
]


def _section_class(cls, dotted_key):
    """(the dataclass that holds the leaf of `dotted_key` inside `cls`, the leaf's name)."""
    from typing import get_type_hints

    *sections, leaf = dotted_key.split(".")
    for section in sections:
        cls = get_type_hints(cls)[section]
    return cls, leaf


@pytest.mark.parametrize("command, key, raw, value", _BAD_VALUES)
def test_a_config_built_in_python_with_a_bad_value_fails_as_one_loaded_from_yaml(command, key, raw, value):
    """Guards against markers (PositiveInt, Literal, finite floats) checked only when a config is
    loaded: a config built in Python with micro_batch_size=0 once reached the trainer."""
    from agentic_rl.train_commands import config_class

    cls = config_class(command)
    required = {"model": "tiny-qwen3"} if command == "serve" else {}
    with pytest.raises(ConfigError) as loaded:
        load_config(cls, None, [f"{k}={v}" for k, v in required.items()] + [f"{key}={raw}"])
    section, leaf = _section_class(cls, key)
    with pytest.raises(ConfigError) as built:
        section(**({**required, leaf: value} if section is cls else {leaf: value}))
    message, given = str(loaded.value).split("\n", 1)  # the problem, then the overrides it came from
    assert given == f"  (--set {' '.join(f'{k}={v}' for k, v in required.items())}{' ' if required else ''}{key}={raw})"
    loaded_problem = message.split(f": '{key}' ", 1)[1]
    assert str(built.value) == f"{section.__name__}: '{leaf}' {loaded_problem}"


def test_every_config_section_of_every_command_checks_its_fields_at_construction():
    """Guards against a new config dataclass that skips the construction checks (one not derived
    from Config is checked only when loaded from YAML, so a check would have to be written twice)."""
    from typing import get_args, get_type_hints

    from agentic_rl.train_commands import CONFIGURED_COMMANDS, config_class
    from agentic_rl.config import Config
    from agentic_rl.rollout.config import SamplingParams

    seen, todo = set(), [config_class(command) for command in CONFIGURED_COMMANDS] + [SamplingParams]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        assert issubclass(cls, Config), (
            f"{cls.__module__}.{cls.__qualname__} does not derive from agentic_rl.config.Config"
        )
        for hint in get_type_hints(cls).values():
            todo.extend(h for h in (hint, *get_args(hint)) if dataclasses.is_dataclass(h))
    assert len(seen) > 30


def test_construction_checks_run_before_the_classs_own_checks_and_once():
    """Guards against a subclass's __post_init__ (GRPO's group_size >= 2) reporting a value its
    marker already refuses, and against each level of a class hierarchy re-checking every field."""
    from unittest import mock

    from agentic_rl import config as config_module
    from agentic_rl.training.grpo_config import GRPORolloutConfig

    with pytest.raises(ConfigError, match=r"^GRPORolloutConfig: 'group_size' must be > 0, got 0$"):
        GRPORolloutConfig(group_size=0, batch_size=8)
    with mock.patch.object(config_module, "check_fields", wraps=config_module.check_fields) as checks:
        GRPORolloutConfig()
    checked = [type(call.args[0]).__name__ for call in checks.call_args_list]
    assert checked == ["Sampling", "GRPORolloutConfig"]  # its sampling section (built first), then itself, once


# ------------------------------------------------------------------ keys another setting makes unused

_UNUSED = [  # (command, overrides, the start of the error after "invalid value in <section>: ")
    (
        "ppo",
        ["value.model=tiny-qwen3"],
        "value.model='tiny-qwen3' is only used with value.critic: separate (value.critic is 'shared')",
    ),
    ("ppo", ["loss.kl_mode=loss"], "loss.kl_mode='loss' is only used with loss.beta > 0 (loss.beta is 0: no KL term)"),
    ("rm", ["pairs.policy=runs/sft/final"], "pairs.policy='runs/sft/final' is only used with pairs.source: sampled"),
    ("rm", ["pairs.samples_per_task=8"], "pairs.samples_per_task=8 is only used with pairs.source: sampled"),
    ("rm", ["pairs.max_pairs_per_task=2"], "pairs.max_pairs_per_task=2 is only used with pairs.source: sampled"),
    ("rm", ["pairs.max_concurrent=8"], "pairs.max_concurrent=8 is only used with pairs.source: sampled"),
    (
        "rm",
        ["pairs.rollout.sampling.temperature=0.5"],
        "pairs.rollout.sampling.temperature=0.5 is only used with pairs.source: sampled",
    ),
    ("grpo", ["selection.max_rounds=3"], "selection.max_rounds=3 is only used with selection.dynamic_sampling: true"),
    ("pipeline", ["control.steps=10"], "control.steps=10 is only used with control.enabled: true"),
    (
        "eval",
        ["model=tiny-qwen3", "rollout.sampling.top_p=0.9"],
        "rollout.sampling.top_p=0.9 is only used with k > 1 (k is 1: pass@1 decodes greedily)",
    ),
    (
        "chat",
        ["model=tiny-qwen3", "seed=3"],
        "seed=3 is only used with rollout.sampling.temperature > 0 (temperature is 0: greedy replies)",
    ),
    (
        "chat",
        ["model=tiny-qwen3", "rollout.sampling.top_k=5"],
        "rollout.sampling.top_k=5 is only used with rollout.sampling.temperature > 0",
    ),
    (
        "sft",
        ["sources=[{kind: jsonl, path: demos.jsonl, n: 5}]"],
        "sft.sources[].n=5 is only used with sft.sources[].kind: oracle",
    ),
    (
        "sft",
        ["sources=[{kind: oracle, path: demos.jsonl}]"],
        "sft.sources[].path='demos.jsonl' is only used with sft.sources[].kind: jsonl",
    ),
]


@pytest.mark.parametrize("command, overrides, message", _UNUSED)
def test_a_key_another_setting_makes_unused_is_refused_naming_that_setting(command, overrides, message):
    """Guards against settings the run silently ignores (docs/design.md invariant 6): value.model with
    a shared critic, or pairs.* of the reward model with corrupted pairs, were once accepted."""
    from agentic_rl.train_commands import config_class

    with pytest.raises(ConfigError) as refused:
        load_config(config_class(command), None, overrides)
    problem, given = str(refused.value).split("\n", 1)  # the problem first, then the overrides
    assert message in problem and given == f"  (--set {' '.join(overrides)})"
    assert problem.endswith(
        "so the run would ignore it; remove it, or set " + message.split(" is only used with ")[1].split(" (")[0]
    )


@pytest.mark.parametrize(
    "command, overrides",
    [
        ("ppo", ["value.critic=separate", "value.model=tiny-qwen3"]),
        ("ppo", ["value.model="]),  # the default, spelled out: no setting
        ("ppo", ["loss.beta=0.04", "loss.kl_mode=loss"]),
        (
            "rm",
            [
                "pairs.source=sampled",
                "pairs.policy=runs/sft/final",
                "pairs.samples_per_task=8",
                "pairs.rollout.sampling.temperature=0.5",
            ],
        ),
        ("rm", ["pairs.rollout.enable_thinking=false"]),  # renders corrupted pairs too
        ("grpo", ["selection.dynamic_sampling=true", "selection.max_rounds=3"]),
        ("pipeline", ["control.enabled=true", "control.steps=10"]),
        ("eval", ["model=tiny-qwen3", "k=4", "rollout.sampling.top_p=0.9"]),
        ("chat", ["model=tiny-qwen3", "rollout.sampling.temperature=0.7", "rollout.sampling.top_k=5", "seed=3"]),
    ],
)
def test_the_same_keys_load_where_their_setting_uses_them(command, overrides):
    """Guards against refusing a key that is used (or one left at its default)."""
    from agentic_rl.train_commands import config_class

    load_config(config_class(command), None, overrides)


def test_loss_max_completion_length_is_derived_from_the_rollout_not_a_key():
    """Guards against a derived value exposed as a user field: dr_grpo's denominator is the most
    policy tokens an episode can hold under the rollout limits, so a second copy could only disagree."""
    from agentic_rl.training.grpo_config import GRPOConfig

    with pytest.raises(
        ConfigError,
        match=r"'loss.max_completion_length' is not a setting: it is derived \(for loss_type dr_grpo, "
        r"the most policy tokens an episode can hold: min\(rollout.max_turns × rollout.max_turn_tokens, "
        r"rollout.max_episode_tokens\)\); remove it",
    ):
        load_config(GRPOConfig, None, ["loss.loss_type=dr_grpo", "loss.max_completion_length=64"])
    limits = ["rollout.max_turns=3", "rollout.max_turn_tokens=100"]
    assert (
        load_config(
            GRPOConfig, None, ["loss.loss_type=dr_grpo", *limits, "rollout.max_episode_tokens=1024"]
        ).loss.max_completion_length
        == 300
    )
    assert (
        load_config(
            GRPOConfig, None, ["loss.loss_type=dr_grpo", *limits, "rollout.max_episode_tokens=256"]
        ).loss.max_completion_length
        == 256
    )
    assert load_config(GRPOConfig, None, []).loss.max_completion_length is None
    assert not any(line.startswith("loss.max_completion_length") for line in describe(GRPOConfig))


def test_a_runs_config_yaml_loads_back_without_its_derived_values(tmp_path):
    """Guards against a run's own config.yaml being refused as --config: dr_grpo derives
    loss.max_completion_length, which a file may not set, so the file must leave it out."""
    from agentic_rl.training.grpo_config import GRPOConfig
    from agentic_rl.training.run_dir import RunDir

    cfg = load_config(GRPOConfig, None, overrides=["model.name=tiny-qwen3", "loss.loss_type=dr_grpo"])
    assert cfg.loss.max_completion_length is not None  # derived from the rollout limits
    RunDir(tmp_path, config=cfg, tensorboard=False).close()  # what every trainer writes
    path = tmp_path / "config.yaml"
    assert "max_completion_length" not in path.read_text()
    again = load_config(GRPOConfig, path)
    assert again == cfg
    old = tmp_path / "old.yaml"  # written before the field was derived: it holds the key, unset
    old.write_text("model: {name: tiny-qwen3}\nloss: {loss_type: dr_grpo, max_completion_length: null}\n")
    assert load_config(GRPOConfig, old) == cfg


# ------------------------------------------------------------------ one name per concept

_SIZE_NAMES = {  # the last part of every key that names a size of a batch, in every command
    "batch_size": "examples per optimizer step (SFT demonstrations, RM pairs); in GRPO/PPO, rollout.batch_size: "
    "episodes per rollout batch, which feeds updates_per_batch optimizer steps",
    "micro_batch_size": "examples per forward/backward on each process (SFT, GRPO, PPO)",
    "max_concurrent": "episodes decoded at once (eval, serve)",
    "updates_per_batch": "μ, optimizer steps per rollout batch",
    "batch_window_ms": "serve: how long a batch waits for more requests (a time, not a size)",
    "max_concurrent_requests": "serve's http: requests admitted at once, decoding or waiting for a slot",
}


@pytest.mark.parametrize("command", ["sft", "rm", "grpo", "ppo", "pipeline", "eval", "serve", "audit", "chat"])
def test_every_command_names_each_batch_size_with_one_of_the_same_few_names(command):
    """Guards against a fourth name for a size that already has one (eval's batch_size meaning
    episodes decoded at once beside GRPO's meaning episodes per step; serve's max_batch; SFT's
    nested batch.micro_batch_size beside GRPO's top-level micro_batch_size)."""
    from agentic_rl.train_commands import config_class

    required = [] if command in ("sft", "rm", "grpo", "ppo", "pipeline") else ["model=tiny-qwen3"]
    keys = _leaves(load_config(config_class(command), None, required))
    for key in keys:
        leaf = key.split(".")[-1]
        if "batch" in leaf or "concurrent" in leaf:
            assert leaf in _SIZE_NAMES, key
        if leaf == "micro_batch_size":  # next to the step's own size: no nested section of its own
            assert key in (
                "micro_batch_size",
                "sft.micro_batch_size",
                "grpo.micro_batch_size",
                "ppo.micro_batch_size",
            ), key


@pytest.mark.parametrize(
    "command, override, message",
    [
        (
            "eval",
            "batch_size=8",
            "unknown key 'batch_size' ('batch_size' is now max_concurrent (episodes decoded at once))",
        ),
        (
            "serve",
            "max_batch=8",
            "unknown key 'max_batch' ('max_batch' is now max_concurrent (requests decoded at once))",
        ),
        (
            "sft",
            "batch.batch_size=8",
            "unknown key 'batch' ('batch' is now the top-level keys batch_size, micro_batch_size and normaliser)",
        ),
        (
            "pipeline",
            "evals=[{batch_size: 8}]",
            "unknown key 'evals[0].batch_size' ('batch_size' is now max_concurrent",
        ),
        ("pipeline", "sft.batch={batch_size: 8}", "unknown key 'sft.batch' ('batch' is now the top-level keys"),
        (
            "grpo",
            "rollout.temperature=0.7",
            "unknown key 'rollout.temperature' ('temperature' is now sampling.temperature)",
        ),
        ("eval", "rollout.top_p=0.9", "unknown key 'rollout.top_p' ('top_p' is now sampling.top_p)"),
        (
            "pipeline",
            "evals=[{rollout: {top_k: 5}}]",
            "unknown key 'evals[0].rollout.top_k' ('top_k' is now sampling.top_k)",
        ),
    ],
)
def test_an_old_name_is_refused_with_the_new_one(command, override, message):
    """Guards against a config written before a rename failing with a bare "unknown key", or, worse,
    the old name still read: the message names where the key went."""
    from agentic_rl.train_commands import config_class

    required = [] if command in ("sft", "grpo", "pipeline") else ["model=tiny-qwen3"]
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(config_class(command), None, required + [override])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "--model", "tiny-qwen3", "--batch-size", "8"], "--batch-size is now --max-concurrent"),
        (["serve", "--model", "tiny-qwen3", "--max-batch", "8"], "--max-batch is now --max-concurrent"),
    ],
)
def test_an_old_flag_is_refused_with_the_new_one(argv, message, capsys):
    """Guards against argparse's bare "unrecognized arguments" for a flag that was renamed."""
    from agentic_rl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_sampling_is_declared_once_and_the_engine_params_derive_from_it():
    """Guards against temperature, top_p and top_k declared twice (a rollout section and the engine's
    SamplingParams), where a new setting or a changed default reaches one and not the other."""
    from agentic_rl.rollout.config import RolloutConfig, Sampling, SamplingParams

    sampling_keys = {f.name for f in dataclasses.fields(Sampling)}
    assert sampling_keys == {"temperature", "top_p", "top_k"}
    assert not sampling_keys & {f.name for f in dataclasses.fields(RolloutConfig)}  # only inside its sampling section
    assert issubclass(SamplingParams, Sampling)  # the engine's params add the seed, nothing redeclared
    assert {f.name for f in dataclasses.fields(SamplingParams)} - sampling_keys == {"greedy", "seed"}

    cfg = load_config(RolloutConfig, None, ["sampling={temperature: 0.7, top_p: 0.9, top_k: 5}"])
    assert cfg.sampling_params(seed=3) == SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=3)
    greedy = cfg.sampling_params(seed=3, temperature=0.0)
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.is_greedy) == (0.0, 0.9, 5, True)
    with pytest.raises(ConfigError, match=r"^--set: 'sampling.top_p' must be in \(0, 1\], got 1.5"):
        load_config(RolloutConfig, None, ["sampling.top_p=1.5"])
    with pytest.raises(ConfigError, match=r"^Sampling: 'temperature' must be >= 0, got -1"):
        Sampling(temperature=-1.0)


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_the_kl_weight_is_bounded_by_the_same_marker_in_grpo_and_ppo(command):
    """Guards against one concept checked two ways: GRPO's loss.beta (and epsilon_high,
    entropy_coef) by hand-written checks with their own wording, PPO's by the config's markers."""
    from agentic_rl.train_commands import config_class

    with pytest.raises(ConfigError) as refused:
        load_config(config_class(command), None, ["loss.beta=-1"])
    assert str(refused.value).split("\n")[0] == "--set: 'loss.beta' must be >= 0, got -1.0"
    if command == "grpo":
        with pytest.raises(ConfigError, match=r"^--set: 'loss.epsilon_high' must be > 0, got 0.0\n"):
            load_config(config_class(command), None, ["loss.epsilon_high=0"])


@pytest.mark.parametrize(
    "command, key, value, interval",
    [
        ("grpo", "loss.epsilon", "1.0", "(0, 1)"),
        ("grpo", "loss.epsilon", "0", "(0, 1)"),
        ("grpo", "loss.entropy_coef", "1", "[0, 1)"),
        ("grpo", "advantage.gamma_per_turn", "1.5", "[0, 1]"),
        ("grpo", "model.lora.dropout", "1.0", "[0, 1)"),
        ("grpo", "rollout.sampling.top_p", "0", "(0, 1]"),
        ("ppo", "loss.gamma_per_token", "1.01", "[0, 1]"),
        ("ppo", "loss.lam_per_token", "-0.1", "[0, 1]"),
    ],
)
def test_a_bounded_number_is_refused_outside_its_interval_with_the_interval_named(command, key, value, interval):
    """Guards against a range checked by a hand-written __post_init__ with its own wording (or not at
    all): every bounded float carries an Interval marker, so loading names the key, the interval and
    the value, `agentic-rl config` shows the interval beside the type, and each end the interval
    holds loads."""
    from agentic_rl.config_docs import describe
    from agentic_rl.train_commands import config_class

    cls = config_class(command)
    with pytest.raises(ConfigError) as refused:
        load_config(cls, None, [f"{key}={value}"])
    assert str(refused.value).split("\n")[0] == f"--set: '{key}' must be in {interval}, got {float(value)}"
    assert any(line.startswith(f"{key} (float in {interval}, default ") for line in describe(cls))
    low, high = interval[1:-1].split(", ")
    turn_mode = (
        ["advantage.mode=turn"] if key == "advantage.gamma_per_turn" else []
    )  # a discount only the turn modes use
    for end, bracket in ((low, interval[0]), (high, interval[-1])):
        if bracket in "[]":
            assert _leaf(load_config(cls, None, [*turn_mode, f"{key}={end}"]), key) == float(end)


@pytest.mark.parametrize(
    "command, old, new",
    [
        ("grpo", "advantage.gamma", "gamma_per_turn"),
        ("ppo", "loss.gamma", "gamma_per_token"),
        ("ppo", "loss.lam", "lam_per_token"),
    ],
)
def test_a_discount_names_its_unit_and_the_old_key_is_refused_with_the_new_name(command, old, new):
    """Guards against one name for three units (GRPO's discount per turn, PPO's per token): the keys
    say which, and a config written with the old key stops, naming the key it became."""
    from agentic_rl.train_commands import config_class

    with pytest.raises(ConfigError) as refused:
        load_config(config_class(command), None, [f"{old}=0.9"])
    assert str(refused.value).startswith(f"--set: unknown key '{old}' ('{old.split('.')[1]}' is now {new}")
    section = old.split(".")[0]
    assert (
        getattr(
            getattr(
                load_config(
                    config_class(command),
                    None,
                    [f"{section}.{new}=0.9", *(["advantage.mode=turn"] if command == "grpo" else [])],
                ),
                section,
            ),
            new,
        )
        == 0.9
    )


def _leaf(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_loading_a_config_imports_no_plugin_and_builds_no_env(tmp_path):
    """Guards against parsing running user code (docs/design.md, layers): loading a config that names a
    plugin, an env and a reward the process has never seen imports nothing and builds nothing; the
    validation step then imports the plugin (which builds its env once when checked) and names the
    unknown reward with its file and key."""
    plugin = tmp_path / "counting_plugin.py"
    plugin.write_text(
        "import dataclasses\n"
        "from agentic_rl.envs.base import Task, register_env\n"
        "from agentic_rl.envs.tool_env import ToolEnv\n"
        "BUILT = []\n"
        "@register_env('counted')\n"
        "class Counted(ToolEnv):\n"
        "    def __init__(self):\n"
        "        BUILT.append(1)\n"
        "        super().__init__(tools=['calculator'], max_turns=2)\n"
        "    def tasks(self, split, n=None, seed=0):\n"
        "        return [Task('c/0', 'What is 1+1?', '2')]\n"
    )
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"plugins: [{plugin}]\nenv: {{name: counted}}\nrewards: [{{name: env_steps}}, {{name: no_such_term}}]\n"
    )
    probe = f"""
import sys
from agentic_rl.config import ConfigError, load_config
from agentic_rl.training.grpo_config import GRPOConfig
from agentic_rl.validation import validate
cfg = load_config(GRPOConfig, {str(config)!r})
print(cfg.env.name, [r.name for r in cfg.rewards], "counting_plugin" in sys.modules)
try:
    validate(cfg, {str(config)!r})
except ConfigError as exc:
    print(str(exc).splitlines()[0])
print(sys.modules["counting_plugin"].BUILT)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "counted ['env_steps', 'no_such_term'] False"
    assert lines[1].startswith(
        f"{config}: invalid value in rewards[1]: unknown reward 'no_such_term'; registered rewards:"
    )
    assert lines[2] == "[1]"
    assert f"plugin {plugin}: importing {plugin} (named by {config})" in done.stderr
