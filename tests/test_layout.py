"""The source layout as a specification (DESIGN.md "Data flow and layout", invariant 9 "arrows
point down"): which package may import which, and small files."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "agentic_rl"

NEVER_IMPORTS = {
    # pure tensor code: no rollouts, no loop, no I/O layers
    "algorithms": {"rollout", "training", "evaluation", "integrations", "serving", "pipeline", "cli", "train_commands"},
    # the training layer never calls up: the CLI and the pipeline pick TRL's backend (integrations/backends.py)
    "training": {"evaluation", "integrations", "serving", "pipeline", "cli", "train_commands"},
    "rollout": {"algorithms", "training", "evaluation", "integrations", "serving", "pipeline", "cli", "train_commands"},
    "evaluation": {"integrations", "serving", "pipeline", "cli", "train_commands"},
    "integrations": {"evaluation", "serving", "pipeline", "cli", "train_commands"},
    "envs": {"rollout", "algorithms", "training", "evaluation", "integrations", "serving", "pipeline", "cli"},
    "tools": {"envs", "rollout", "algorithms", "training", "evaluation", "integrations", "serving", "pipeline", "cli"},
}
"""package -> the packages (or top-level modules) of agentic_rl it must never import, even lazily."""

MAX_LINES = 450


def _imports(path: Path) -> set[str]:
    """The agentic_rl packages / top-level modules a file imports, at any depth (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        found |= {name.split(".")[1] for name in names if name.startswith("agentic_rl.") and name.count(".") >= 1}
    return found


def test_no_lower_layer_imports_a_higher_one():
    """Guards against an arrow pointing up (e.g. training/ importing the pipeline to reach TRL's
    backend, as `train_grpo` once did), found by parsing every import, lazy ones included."""
    wrong = []
    for package, forbidden in NEVER_IMPORTS.items():
        for path in sorted((SRC / package).rglob("*.py")):
            for target in sorted(_imports(path) & forbidden):
                wrong.append(f"{path.relative_to(SRC)} imports agentic_rl.{target}")
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


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
