"""The source layout as a specification (docs/design.md "Layers"; issue 34): small files,
and one GRPO or PPO step that reads in one place. The import arrows: test_import_layers.py."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "agentic_rl"

READ_AS_ONE = 450
"""A file past this many lines is named to the reviewer (a warning): it may hold two ideas."""
MAX_LINES = 600
"""A file past this many lines holds two ideas for certain: the test fails."""


def test_every_source_file_fits_in_one_reading():
    """Guards against files that grow past one idea: a file over 450 lines is a warning a reviewer
    reads (the formatter's layout lengthened seven files past it), one over 600 fails."""
    sizes = {str(path.relative_to(SRC)): len(path.read_text().splitlines()) for path in sorted(SRC.rglob("*.py"))}
    long = {name: n for name, n in sizes.items() if n > READ_AS_ONE}
    if long:
        warnings.warn(
            "files past one reading (split by idea where they hold two): "
            + ", ".join(f"{name} {n}" for name, n in long.items()),
            stacklevel=1,
        )
    too_long = [f"{name}: {n} lines" for name, n in sizes.items() if n > MAX_LINES]
    assert not too_long, "split these files by idea:\n" + "\n".join(too_long)


def test_a_grpo_and_a_ppo_step_each_read_in_one_place():
    """Guards against the step scattering again over base-class hooks: GRPO's and PPO's `step` and
    `rollout_batch` live in their own module, and together stay within one screenful or two
    (about 80 lines), each line a named step."""
    for name, cls in (("grpo", "GRPO"), ("ppo", "PPO")):
        tree = ast.parse((SRC / "training" / f"{name}.py").read_text())
        algorithm = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls)
        assert [base for base in algorithm.bases] == [], f"{cls} inherits its step: the step must be its own code"
        methods = {node.name: node for node in algorithm.body if isinstance(node, ast.FunctionDef)}
        lines = sum(methods[m].end_lineno - methods[m].lineno + 1 for m in ("step", "rollout_batch"))
        assert lines <= 80, f"{cls}.step + rollout_batch span {lines} lines"


def test_no_code_is_found_by_a_string():
    """Guards against dispatch through module strings (`__import__("agentic_rl.pipeline")`, a config
    class named by its module), which go-to-definition cannot follow: the commands import their
    trainers and config classes by import statements (train_commands.py). Only plugin_loading.py
    imports by name, because a user's plugin is a name in a config."""
    by_name = sorted(
        {
            str(path.relative_to(SRC))
            for path in SRC.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("__import__", "import_module")
        }
    )
    assert by_name == ["plugin_loading.py"]
