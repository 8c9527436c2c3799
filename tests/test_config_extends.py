"""`extends:` in config files: a file or section starts from another file and states only what differs."""

import dataclasses
from pathlib import Path

import pytest

from agentic_rl.cli import config_class
from agentic_rl.config import ConfigError, load_config

CONFIGS = Path(__file__).parent.parent / "configs" / "experiments"


@dataclasses.dataclass
class Optim:
    lr: float = 1e-5
    """Peak learning rate."""
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    """Adam betas."""


@dataclasses.dataclass
class Stage:
    steps: int = 10
    """Optimizer steps."""
    optim: Optim = dataclasses.field(default_factory=Optim)
    """Optimizer settings."""


@dataclasses.dataclass
class Example:
    name: str = "x"
    """A name."""
    tags: list[str] = dataclasses.field(default_factory=list)
    """Free-form tags."""
    sft: Stage = dataclasses.field(default_factory=Stage)
    """One stage."""
    grpo: Stage = dataclasses.field(default_factory=Stage)
    """Another stage."""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_file_extends_another_mappings_merge_and_other_values_replace(tmp_path, monkeypatch):
    """Guards against an `extends` that replaces a whole section where one key was given (the extended file's
    other sft.optim keys lost), that merges lists element-wise, or that resolves the path from the working
    directory instead of the file that names it."""
    write(
        tmp_path / "base" / "base.yaml",
        "name: base\ntags: [a, b]\nsft:\n  steps: 152\n  optim: {lr: 5.0e-4, betas: [0.8, 0.9]}\ngrpo: {steps: 16}\n",
    )
    child = write(tmp_path / "base" / "child.yaml", "extends: base.yaml\ntags: [c]\nsft:\n  optim: {lr: 1.0e-3}\n")
    monkeypatch.chdir(tmp_path)  # child.yaml's `base.yaml` is next to it, not here
    cfg = load_config(Example, child)
    assert cfg == Example(
        name="base", tags=["c"], sft=Stage(steps=152, optim=Optim(lr=1e-3, betas=[0.8, 0.9])), grpo=Stage(steps=16)
    )


def test_a_mapping_tagged_replace_drops_the_base_keys_instead_of_merging(tmp_path):
    """Guards against a section that cannot leave its base behind: switching a stage's optimizer (or a
    pipeline's env) inherited every key of the base's mapping. `!replace` keeps only what it writes, at
    any depth, through chained files, and is refused on anything but a mapping."""
    write(
        tmp_path / "base.yaml",
        "sft:\n  steps: 152\n  optim: {lr: 5.0e-4, betas: [0.8, 0.9]}\ngrpo: {steps: 16, optim: {lr: 0.5}}\n",
    )
    write(tmp_path / "middle.yaml", "extends: base.yaml\nname: middle\n")
    child = write(
        tmp_path / "child.yaml",
        "extends: middle.yaml\nsft:\n  optim: !replace {lr: 1.0e-3}\ngrpo: !replace {steps: 2}\n",
    )
    cfg = load_config(Example, child)
    assert cfg.sft == Stage(steps=152, optim=Optim(lr=1e-3))  # betas back to the default, steps still merged
    assert cfg.grpo == Stage(steps=2) and cfg.name == "middle"
    bad = write(tmp_path / "bad.yaml", "extends: base.yaml\ntags: !replace [a]\n")
    with pytest.raises(ConfigError, match=r"!replace applies to a mapping, e\.g\. `env: !replace \{name: squares\}`"):
        load_config(Example, bad)


def test_a_section_extends_a_file_and_files_chain(tmp_path):
    """Guards against `extends` read only at the top level, or a chained file's path taken relative to the first
    file instead of the one that names it."""
    write(tmp_path / "stages" / "deep.yaml", "steps: 3\noptim: {lr: 0.5}\n")
    write(tmp_path / "stages" / "grpo.yaml", "extends: deep.yaml\nsteps: 8\n")
    top = write(tmp_path / "top.yaml", "grpo:\n  extends: stages/grpo.yaml\n  optim: {betas: [0.5, 0.6]}\n")
    cfg = load_config(Example, top, overrides=["grpo.steps=9"])  # --set applies after the files
    assert cfg.grpo == Stage(steps=9, optim=Optim(lr=0.5, betas=[0.5, 0.6]))
    assert cfg.sft == Stage()


def test_an_unknown_key_from_an_extended_file_names_that_file(tmp_path):
    """Guards against an error that names only the top file when the bad key sits in a file it extends."""
    base = write(tmp_path / "base.yaml", "sft: {stepz: 3}\n")
    child = write(tmp_path / "child.yaml", "extends: base.yaml\n")
    with pytest.raises(ConfigError, match="sft.stepz") as info:
        load_config(Example, child)
    assert str(child) in str(info.value) and str(base) in str(info.value)


def test_a_cycle_is_refused_with_its_chain(tmp_path):
    """Guards against infinite recursion (a RecursionError traceback) when files extend each other."""
    write(tmp_path / "a.yaml", "extends: b.yaml\n")
    write(tmp_path / "b.yaml", "sft:\n  extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"'sft.extends': a.yaml extends itself: .*a.yaml -> .*b.yaml -> .*a.yaml"):
        load_config(Example, tmp_path / "a.yaml")


def test_the_same_file_extended_twice_is_not_a_cycle(tmp_path):
    """Guards against a cycle check that refuses two sections starting from one file."""
    write(tmp_path / "stage.yaml", "steps: 4\n")
    cfg = load_config(Example, write(tmp_path / "c.yaml", "sft: {extends: stage.yaml}\ngrpo: {extends: stage.yaml}\n"))
    assert cfg.sft.steps == cfg.grpo.steps == 4


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("missing.yaml", r"cannot read config file .*missing.yaml"),
        ("[1]", r"must be the path of a YAML file, got \[1\]"),
        ("list.yaml", r"the top level must be a mapping"),
    ],
)
def test_a_bad_extends_names_the_file_the_key_and_the_problem(tmp_path, value, fragment):
    """Guards against a missing or malformed extended file reported without the file and key that named it."""
    write(tmp_path / "list.yaml", "- 1\n")
    child = write(tmp_path / "child.yaml", f"grpo:\n  extends: {value}\n")
    with pytest.raises(ConfigError, match=rf"child.yaml: 'grpo.extends'.*{fragment}"):
        load_config(Example, child)


def test_extends_from_set_is_refused(tmp_path):
    """Guards against `--set sft.extends=...` reaching the strict loader as a baffling unknown key, or being
    resolved against the working directory."""
    write(tmp_path / "stage.yaml", "steps: 4\n")
    with pytest.raises(ConfigError, match=r"'sft.extends' works only inside a config file"):
        load_config(Example, None, overrides=[f"sft.extends={tmp_path / 'stage.yaml'}"])


def test_the_short_plan_pipeline_is_the_plan_pipeline_with_its_stated_changes():
    """Guards against a shipped config whose `extends` drifts from what its header and EXPERIMENTS.md say it
    runs: plan-short-pipeline.yaml is plan-pipeline.yaml with SFT at lr 1e-3 for 80 steps and GRPO as
    plan-wide-grpo.yaml (8 houses an update, once each, 8 steps)."""
    pipeline = config_class("pipeline")
    short = load_config(pipeline, CONFIGS / "plan-short-pipeline.yaml")
    assert short == load_config(
        pipeline,
        CONFIGS / "plan-pipeline.yaml",
        overrides=[
            "output_dir=runs/plan-short",
            "sft.optim.lr=1e-3",
            "sft.train.steps=80",
            "grpo.rollout.batch_size=32",
            "grpo.updates_per_batch=1",
            "grpo.train.steps=8",
        ],
    )
    wide = load_config(config_class("grpo"), CONFIGS / "plan-wide-grpo.yaml")
    stage_keys = {"model", "train"}  # set by the pipeline in its stages
    assert {f.name: getattr(short.grpo, f.name) for f in dataclasses.fields(wide) if f.name not in stage_keys} == {
        f.name: getattr(wide, f.name) for f in dataclasses.fields(wide) if f.name not in stage_keys
    }
    assert (short.grpo.train.steps, short.grpo.train.seed) == (wide.train.steps, wide.train.seed) == (8, 0)
    assert (short.sft.optim.lr, short.sft.optim.schedule, short.sft.train.steps) == (1e-3, "constant", 80)
    # what the recorded runs used from the extended files (EXPERIMENTS.md, "plan, session 35"): a change to
    # plan-pipeline.yaml or plan-progress-grpo.yaml would change them too
    assert [(source.env.options, source.n) for source in short.sft.sources] == [
        ({"difficulty": 1, "branching": 1}, 80),
        ({"difficulty": 2, "branching": 1}, 80),
    ]
    assert (short.sft.batch_size, short.sft.micro_batch_size) == (8, 4)
    assert (
        short.grpo.rollout.group_size,
        short.grpo.rollout.sampling.temperature,
        short.grpo.optim.lr,
        short.grpo.advantage.mode,
        short.grpo.env.options["progress_reward"],
    ) == (4, 0.5, 3e-4, "turn_position", 0.1)


# ---------------------------------------------------------------------- bounded parsing (issue 65)


def test_extends_reads_regular_files_only(tmp_path):
    """Guards against `extends: /dev/zero` reading until memory runs out."""
    child = write(tmp_path / "child.yaml", "extends: /dev/zero\n")
    with pytest.raises(ConfigError, match=r"child.yaml: 'extends': config file /dev/zero is not a regular file"):
        load_config(Example, child)


def test_a_config_file_over_the_size_cap_is_refused_unparsed(tmp_path):
    """Guards against a multi-megabyte file being parsed (and held) whole."""
    from agentic_rl.config_yaml import MAX_CONFIG_BYTES

    big = write(tmp_path / "big.yaml", "tags: [" + "a, " * (MAX_CONFIG_BYTES // 3 + 1) + "]\n")
    with pytest.raises(ConfigError, match=rf"big.yaml is larger than {MAX_CONFIG_BYTES} bytes"):
        load_config(Example, big)


def test_a_yaml_alias_bomb_stops_at_the_value_bound(tmp_path):
    """Guards against nine levels of nine aliases (9^9 values once expanded) exhausting memory."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = write(tmp_path / "bomb.yaml", "\n".join(levels) + "\n")
    with pytest.raises(ConfigError, match=r"bomb.yaml: holds more than 100000 values once its aliases"):
        load_config(Example, bomb)
    flow = ["&a0 [x, x, x, x, x, x, x, x, x]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    with pytest.raises(
        ConfigError, match=r"override 'tags=\[&a0 .*: holds more than 100000 values"
    ):  # --set: the same bound
        load_config(Example, None, overrides=[f"tags=[{', '.join(flow)}]"])


def test_yaml_nested_beyond_the_depth_bound_is_an_error_not_a_recursion_error(tmp_path):
    """Guards against 20,000 nested lists ending in a raw RecursionError."""
    deep = write(tmp_path / "deep.yaml", "tags: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(ConfigError, match=r"deep.yaml: nested deeper than 100 levels"):
        load_config(Example, deep)


def test_files_whose_sections_extend_the_next_twice_over_stop_at_the_bound(tmp_path):
    """Guards against 25 files, each with two sections extending the next, never finishing (2^24 copies)."""
    import time

    for i in range(25):
        write(
            tmp_path / f"f{i}.yaml",
            "steps: 1\n" if i == 24 else f"sft: {{extends: f{i + 1}.yaml}}\ngrpo: {{extends: f{i + 1}.yaml}}\n",
        )
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"more than 100000 values once its `extends` are expanded"):
        load_config(Example, tmp_path / "f0.yaml")
    assert time.perf_counter() - started < 30


@pytest.mark.parametrize("flag, pair", [("--option", "difficulty=[1,"), ("--arg", "expression=[1,")])
def test_a_flag_value_that_is_not_yaml_names_the_flag(flag, pair, capsys):
    """Guards against `--option 'difficulty=[1,'` and `--arg 'expression=[1,'` ending in a raw YAML traceback."""
    from agentic_rl import cli

    argv = (
        ["envs", "oracle", "arith", "--n", "1", "--option", pair]
        if flag == "--option"
        else ["tools", "run", "calculator", "--arg", pair]
    )
    assert cli.main(argv) == 2
    assert f"error: {flag} '{pair}': its value is not YAML" in capsys.readouterr().err
