"""The source layout as a specification (docs/design.md "Layers"; issue 34): small files,
and one GRPO or PPO step that reads in one place. The import arrows: test_import_layers.py."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "agentic_rl"

MAX_LINES = 450


def test_every_source_file_fits_in_one_reading():
    """Guards against files that grow past one idea: none over 450 lines (issue 34)."""
    long = [f"{path.relative_to(SRC)}: {n} lines" for path in sorted(SRC.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, "split these files:\n" + "\n".join(long)


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
    trainers and config classes by import statements (train_commands.py). Only plugins.py imports
    by name, because a user's plugin is a name in a config."""
    by_name = sorted({str(path.relative_to(SRC)) for path in SRC.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("__import__", "import_module")})
    assert by_name == ["plugins.py"]
