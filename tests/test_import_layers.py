"""docs/design.md invariant 9, arrows point down: the import rules docs/design.md states, read from the source with
`ast`. Imports inside functions count too, so a lazy import cannot hide an upward arrow.

Beyond the rules docs/design.md writes down, the parts' arrows form no circle at all: whatever two
parts are, at most one of them imports the other, directly or through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "agentic_rl"

# (importing part, parts it must never import, why, in docs/design.md's words)
RULES = [
    (
        "training",
        {"integrations", "cli", "pipeline", "serving", "evaluation"},
        "the caller (cli/pipeline) picks the backend; training/ never imports integrations/",
    ),
    (
        "models",
        {"rollout", "training", "evaluation", "serving", "integrations", "cli", "pipeline"},
        "anything that needs a model loaded imports models/, never training/; the engine (rollout/) sits on models/",
    ),
    (
        "plugins",
        {"envs", "tools", "rewards", "registry", "rollout", "models", "training", "validation", "cli", "pipeline"},
        "plugins.py is the `plugins` key and the entry points, below the registries that load them; "
        "importing a user's modules after the built-ins is plugin_loading.py's",
    ),
    (
        "algorithms",
        {
            "models",
            "training",
            "rollout",
            "envs",
            "rewards",
            "tools",
            "evaluation",
            "serving",
            "integrations",
            "cli",
            "pipeline",
        },
        "algorithms/ is losses and advantages: pure tensor code, no model and no I/O (a model's forward is models/)",
    ),
    (
        "rewards",
        {"algorithms", "training", "evaluation", "integrations", "serving", "cli", "pipeline"},
        "a reward term scores trajectories; the trainers call it, never the other way round",
    ),
    (
        "rollout",
        {"algorithms", "training", "integrations", "evaluation", "serving", "cli", "pipeline"},
        "the engine serves training, evaluation and serving alike",
    ),
    (
        "evaluation",
        {"integrations", "serving", "cli", "pipeline"},
        "envs → rollout → algorithms → training → evaluation: evaluation is the last layer below the commands",
    ),
    (
        "integrations",
        {"evaluation", "serving", "cli", "pipeline"},
        "integrations/trl adapts our envs and rewards to TRL; the caller picks the backend",
    ),
    (
        "envs",
        {"rollout", "algorithms", "training", "evaluation", "integrations", "serving", "cli", "pipeline"},
        "envs are the first layer: tasks, tools and grading, no model",
    ),
    (
        "tools",
        {"envs", "rollout", "algorithms", "training", "evaluation", "integrations", "serving", "cli", "pipeline"},
        "a tool is a typed function an env calls",
    ),
]
# Loading a config only loads (docs/design.md, "Seams"): the loader's modules import no registry,
# plugin or layer that builds an env; the validation step (validation.py) does that.
_LOADER_NEVER = {
    "plugins",
    "validation",
    "envs",
    "rewards",
    "tools",
    "models",
    "rollout",
    "algorithms",
    "training",
    "evaluation",
    "integrations",
    "serving",
    "cli",
    "pipeline",
}
RULES += [
    (loader, _LOADER_NEVER, "loading a config parses it; plugins and envs are the validation step's")
    for loader in ("config", "config_extends", "config_yaml")
]
TOP = {"cli", "pipeline", "train_commands"}  # the commands: nothing below them imports them


def _part(path: Path) -> str:
    """The top-level part of agentic_rl a file belongs to: 'training' for training/grpo.py, 'cli' for cli.py."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imported_parts(path: Path) -> set[str]:
    """The agentic_rl parts a file imports anywhere in it (relative imports resolved against its package)."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]  # ('agentic_rl', 'training')
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names = [module] + ([f"{module}.{alias.name}" for alias in node.names] if module == "agentic_rl" else [])
        else:
            continue
        parts.update(name.split(".")[1] for name in names if name.startswith("agentic_rl.") and name.count(".") >= 1)
    return parts


def _arrows() -> dict[str, dict[str, list[str]]]:
    """part -> imported part -> the files of `part` that import it."""
    arrows: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _part(path)
        for there in _imported_parts(path) - {here}:
            arrows.setdefault(here, {}).setdefault(there, []).append(str(path.relative_to(PACKAGE)))
    return arrows


def test_the_import_reader_sees_the_arrows_that_exist():
    """Guards against the rules below passing vacuously: the reader must find arrows the package has
    (training/ imports algorithms/ and rollout/, the CLI imports training/)."""
    arrows = _arrows()
    assert {"algorithms", "rollout"} <= set(arrows["training"]) and "training" in arrows["cli"], arrows


@pytest.mark.parametrize("part, forbidden, why", RULES, ids=[rule[0] for rule in RULES])
def test_a_lower_layer_never_imports_a_higher_one(part, forbidden, why):
    """Guards against an upward import (docs/design.md invariant 9), e.g. training/ reaching into integrations/
    or models/ into training/, which would make the lower layer untestable without the higher one."""
    wrong = {there: files for there, files in _arrows().get(part, {}).items() if there in forbidden}
    assert not wrong, f"{part}/ must not import {sorted(wrong)} ({why}); found in {wrong}"


def test_nothing_below_the_commands_imports_them():
    """Guards against library code importing the CLI or the pipeline, the two entry points at the top."""
    wrong = {here: {t: f for t, f in there.items() if t in TOP} for here, there in _arrows().items() if here not in TOP}
    assert not any(wrong.values()), {here: files for here, files in wrong.items() if files}


def _circles(arrows: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Every circle of parts (a strongly connected group of two or more), found by Tarjan's algorithm."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(part: str) -> None:
        order[part] = low[part] = len(order)
        stack.append(part)
        for there in arrows.get(part, {}):
            if there not in order:
                visit(there)
                low[part] = min(low[part], low[there])
            elif there in stack:
                low[part] = min(low[part], order[there])
        if low[part] == order[part]:
            group = []
            while not group or group[-1] != part:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for part in sorted(arrows):
        if part not in order:
            visit(part)
    return circles


def test_the_circle_finder_finds_a_circle():
    """Guards against the no-circle rule below passing vacuously: two parts that import each other,
    and a three-part circle beside an innocent arrow, are found."""
    assert _circles({"a": {"b": []}, "b": {"a": []}}) == [["a", "b"]]
    assert _circles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b": []}, "b": {"c": []}}) == []


def test_no_two_parts_import_each_other():
    """Guards against a package circle, e.g. models/device.py importing rollout/config.py while rollout/
    imports models/, or plugins.py importing the registries that import it: with a circle, which part
    is lower is a matter of which import runs first, and a function-local import is what holds it up.
    Imports inside functions count."""
    arrows = _arrows()
    circles = _circles(arrows)
    where = {
        f"{a} -> {b}": arrows[a][b] for circle in circles for a in circle for b in circle if b in arrows.get(a, {})
    }
    assert not circles, f"parts importing each other: {circles}; the arrows: {where}"
