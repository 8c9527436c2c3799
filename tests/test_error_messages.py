"""Bad input ends a command with a message that names the file, key or value and what to do.

One test per case that once ended in a raw traceback or an unusable message: damaged model and
stage folders, a loop of stage bases, `eval --out` paths, values quoted by the megabyte, env
options of the wrong type, and the toolkit's own JSON records damaged on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rl.cli import main
from agentic_rl.envs.base import make_env
from agentic_rl.errors import quoted
from agentic_rl.models import load_model
from agentic_rl.models.stage_output import STAGE_RECORD, load_base_and_tokenizer


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory, tiny_qwen3):
    """tiny-qwen3 saved with save_pretrained: a real model folder to damage (copied per test)."""
    folder = tmp_path_factory.mktemp("tiny")
    model, tokenizer = tiny_qwen3
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _copy(folder: Path, to: Path) -> Path:
    to.mkdir()
    for item in folder.iterdir():
        (to / item.name).write_bytes(item.read_bytes())
    return to


def test_a_model_folder_with_a_corrupt_config_names_the_file_and_line(saved_tiny, tmp_path):
    """Guards against a corrupt config.json surfacing as a bare JSONDecodeError: the message names the file, the
    line and the fix."""
    folder = _copy(saved_tiny, tmp_path / "m")
    (folder / "config.json").write_text('{\n  "model_type": "qwen3",\n  "hidden_size": 64,,\n}')
    with pytest.raises(
        ValueError, match=r"m/config.json: not valid JSON \(line 3 column 21: .*restore it or save the model again"
    ):
        load_model(str(folder))


def test_a_model_folder_without_weights_says_which_files_it_looked_for(saved_tiny, tmp_path):
    """Guards against a folder with a config but no weights loading random weights or failing vaguely: it names
    the weight files it looked for."""
    folder = _copy(saved_tiny, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"'.*/m' has a config.json but no weights \(none of model.safetensors, "):
        load_model(str(folder))


def test_weights_of_another_shape_name_the_folder_not_a_size_mismatch_traceback(saved_tiny, tmp_path):
    """Guards against a config/weights shape mismatch surfacing as transformers' size-mismatch traceback instead
    of naming the folder."""
    folder = _copy(saved_tiny, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] *= 2  # the saved MLP weights no longer fit
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'.*/m': its weights do not fit its config: a tensor has another shape"):
        load_model(str(folder))


def test_a_stage_record_naming_itself_as_its_base_is_a_loop_not_a_recursion_error(tmp_path):
    """Guards against a stage record whose base is itself crashing with RecursionError: the loop is named with
    its file."""
    stage = tmp_path / "final"
    stage.mkdir()
    (stage / STAGE_RECORD).write_text(json.dumps({"kind": "lora", "base": str(stage)}))
    with pytest.raises(
        ValueError, match=r"final/agentic_rl_model.json: the stage records' bases form a loop \(.*final -> .*final\)"
    ):
        load_base_and_tokenizer(str(stage), "float32")


def test_a_loop_through_two_stage_records_names_both(tmp_path):
    """Guards against a two-folder loop of stage records recursing forever: the message shows the whole
    cycle a -> b -> a."""
    a, b = tmp_path / "a", tmp_path / "b"
    for here, base in ((a, b), (b, a)):
        here.mkdir()
        (here / STAGE_RECORD).write_text(json.dumps({"kind": "lora", "base": str(base)}))
    with pytest.raises(ValueError, match=r"form a loop \(.*/a -> .*/b -> .*/a\)"):
        load_base_and_tokenizer(str(a), "float32")


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ("{not json", r"agentic_rl_model.json: not valid JSON \(line 1 column 2: .*delete it if"),
        (
            json.dumps({"kind": "lora"}),
            r'a stage record is \{"kind": "lora" \| "full", "base": "<model>"\}, got \{\'kind\': \'lora\'\}',
        ),
    ],
)
def test_a_damaged_stage_record_names_its_file(tmp_path, record, match):
    """Guards against invalid JSON or a stage record missing `base` failing without naming agentic_rl_model.json
    and its expected form."""
    (tmp_path / STAGE_RECORD).write_text(record)
    with pytest.raises(ValueError, match=match):
        load_base_and_tokenizer(str(tmp_path), "float32")


def test_a_lora_stage_without_its_adapter_files_says_so(tmp_path):
    """Guards against a LoRA stage folder without its adapter files loading the bare base model silently."""
    (tmp_path / STAGE_RECORD).write_text(json.dumps({"kind": "lora", "base": "tiny-qwen3"}))
    with pytest.raises(
        ValueError, match=r"says LoRA adapters, but adapter_config.json and adapter_model.safetensors is missing"
    ):
        load_base_and_tokenizer(str(tmp_path), "float32")


_TINY_EVAL = [
    "eval",
    "--model",
    "tiny-qwen3",
    "--env",
    "arith",
    "--n",
    "2",
    "--max-turns",
    "1",
    "--max-turn-tokens",
    "4",
    "--json",
]


def test_eval_out_into_a_missing_folder_creates_it(tmp_path, capsys):
    """Guards against `eval --out` failing after the whole evaluation because its parent folders do not exist yet."""
    out = tmp_path / "results" / "today" / "eval.json"
    assert main([*_TINY_EVAL, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == 2


def test_eval_out_that_is_a_folder_is_refused_before_the_evaluation(tmp_path, capsys, monkeypatch):
    """Guards against an --out that is a folder being found only after minutes of evaluation: it is refused
    first, with the fix."""
    import agentic_rl.evaluation.runner as evaluate_module

    monkeypatch.setattr(evaluate_module, "evaluate", lambda *a, **k: pytest.fail("evaluated before checking --out"))
    assert main([*_TINY_EVAL, "--out", str(tmp_path)]) == 2
    assert (
        f"--out '{tmp_path}' is a folder; give a file name, e.g. --out {tmp_path / 'eval.json'}"
        in capsys.readouterr().err
    )


def test_eval_out_under_a_file_is_refused(tmp_path, capsys):
    """Guards against an --out path under an existing file crashing late or overwriting the user's file."""
    (tmp_path / "notes").write_text("mine")
    assert main([*_TINY_EVAL, "--out", str(tmp_path / "notes" / "eval.json")]) == 2
    assert "a part of it is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "notes").read_text() == "mine"


def test_a_value_of_megabytes_is_quoted_in_a_few_hundred_characters(capsys):
    """Guards against an error message that echoes a 10 MB value to the terminal: the value is cut and the rest
    counted."""
    huge = "9" * 10_000_000 + "x"
    assert main(["grpo", "--set", f"train.steps={huge}"]) == 2
    err = capsys.readouterr().err
    assert len(err) < 2_000, len(err)
    assert "'train.steps' must be an integer, got '" + "9" * 200 + "…' (+9999801 characters)" in err


def test_quoted_cuts_long_values_and_counts_the_rest():
    """Guards against `quoted` cutting values without saying how much was cut, or cutting short values at all."""
    assert quoted("ab") == "'ab'"
    assert quoted("a" * 205) == "'" + "a" * 200 + "…' (+5 characters)"
    assert quoted(list(range(100)), limit=10) == "[0, 1, 2, … (+380 characters)"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"tools": "none"},
            r"environment 'gsm8k': 'options.tools' got 'none', which fits none of list\[str\]",
        ),  # was: unknown tool 'n'
        ({"tools": 1.5}, r"'options.tools' got 1.5"),  # was: 'float' object is not iterable
        ({"n": "ten"}, r"'options.n' must be an integer, got 'ten'"),
    ],
)
def test_env_options_of_the_wrong_type_name_the_option_and_value(options, match):
    """Guards against env options of the wrong type failing with a confusing error (a string iterated as a tool
    list, a float not iterable)."""
    with pytest.raises(ValueError, match=match):
        make_env("gsm8k", **options)


def test_an_env_option_in_a_config_names_the_config_and_key(capsys):
    """Guards against a bad env option from the CLI that does not name the config key (env.options.tools) the
    user set."""
    assert main(["eval", "--model", "tiny-qwen3", "--env", "gsm8k", "--option", "tools=none", "--n", "1"]) == 2
    problem, given = capsys.readouterr().err.splitlines()  # the problem first, then the overrides it came from
    assert problem.startswith("error: --set: invalid value in env: environment 'gsm8k': 'options.tools' got 'none'")
    assert given == "  (--set model=tiny-qwen3 env.name=gsm8k n=1 env.options.tools=none)"


def test_a_damaged_reward_model_record_names_its_file(tmp_path):
    """Guards against a corrupt reward-model record failing without naming the file, its line, and
    `agentic-rl rm` as the fix."""
    from agentic_rl.models.reward_scorer import RM_RECORD, load_trained_reward_model

    (tmp_path / RM_RECORD).write_text('{"lora": true')
    with pytest.raises(ValueError, match=rf"{RM_RECORD}: not valid JSON \(line 1 column 14: .*agentic-rl rm"):
        load_trained_reward_model(tmp_path)


@pytest.mark.parametrize("batch_size, advice", [(2, "Use batch_size=4."), (10, "Use batch_size=8 or 12.")])
def test_a_batch_of_broken_groups_is_told_the_nearest_whole_group_sizes(batch_size, advice):
    """A batch smaller than one group once read "Use batch_size=4 or 4"."""
    from agentic_rl.training.episode_config import BatchRolloutConfig

    with pytest.raises(
        ValueError, match=f"rollout.batch_size={batch_size} is not a multiple of rollout.group_size=4"
    ) as raised:
        BatchRolloutConfig(batch_size=batch_size, group_size=4)
    assert str(raised.value).endswith(advice)
