"""docs/design.md invariant 9, arrows point down: the import rules docs/design.md states, read from the source with
`ast`. Imports inside functions count too, so a lazy import cannot hide an upward arrow.

Beyond the rules docs/design.md writes down, the parts' arrows form no circle at all: whatever two
parts are, at most one of them imports the other, directly or through others.

And an import sits at the top of its module unless its first line says why it cannot
(`# local: cycle`, `torch-free`, `optional extra` or `platform`), and the reason holds (issue 68).
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import tomllib
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


# Function-local imports (issue 68): an import inside a function hides an edge from whoever reads the
# module's top, so one stays local only for a reason its first line states, and that this file checks:
#   `# local: cycle`          the imported agentic_rl module's top-level import closure reaches the
#                             importing module, so a top-level import would close a circle;
#   `# local: torch-free`     the import would load torch (LOADS_TORCH) into a module whose top-level closure
#                             loads none, or any HEAVY package into one whose closure loads no HEAVY package
#                             (`agentic-rl --help` and config loading load no torch);
#   `# local: optional extra` a package of an extra in pyproject.toml, not a core dependency;
#   `# local: platform`       a standard-library module that exists only on some platforms (PLATFORM).
# Everything else belongs at the top of the module. Imports under `if TYPE_CHECKING:` are not local.
LOCAL_REASONS = ("cycle", "torch-free", "optional extra", "platform")

# Third-party packages (or submodules) that are slow to import or pull one in, timed with
# `python -X importtime -c "import X"` on the 2-core development machine. Light, so not listed: yaml
# (19 ms), tokenizers (15 ms), huggingface_hub (12 ms), tqdm (57 ms), rich, jinja2, and bare tensorboard
# (3 ms) and safetensors (1 ms): torch.utils.tensorboard and safetensors.torch are torch's.
HEAVY = {
    "torch": "1.3 s, and it imports numpy",
    "transformers": "0.6 s, imports numpy (and torch as soon as a model class is touched)",
    "peft": "imports torch and transformers: about 5 s",
    "accelerate": "imports torch: 1.4 s",
    "trl": "its trainers and utilities import torch, transformers and datasets: about 5 s",
    "datasets": "1 s, imports pyarrow and numpy",
    "pyarrow": "0.2 s, imports numpy",
    "numpy": "0.1 s, and the base of every package above",
    "gguf": "0.2 s, imports numpy",
    "safetensors.torch": "imports torch",
    "starlette": "its applications, requests and responses import anyio: 0.1 s",
    "uvicorn": "0.1 s, the server's",
    "matplotlib": "0.25 s, imports numpy",
    "math_verify": "0.4 s, imports sympy",
    "sympy": "0.25 s",
    "openai": "0.9 s",
}
# The HEAVY packages whose import loads torch: a module that imports none of them (tools/base.py takes
# transformers.utils, say) loads no torch. `import trl` alone is lazy, but every name we take from it loads
# torch; transformers' model classes do too, and every module of ours that takes one imports torch itself
# (read this way, the closures matched a fresh interpreter's sys.modules for all 135 modules).
LOADS_TORCH = ("torch", "accelerate", "peft", "trl", "safetensors.torch")
# Standard-library modules that exist only on some platforms: the one reason a stdlib import stays local.
PLATFORM = {"fcntl": "POSIX only", "resource": "POSIX only", "termios": "POSIX only", "msvcrt": "Windows only"}
_LOCAL_TAG = re.compile(r"local:\s*(.*\S)")


def _module_name(path: Path, root: Path) -> str:
    """'agentic_rl.training.grpo' for <root>/agentic_rl/training/grpo.py, 'agentic_rl.envs' for its __init__.py."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """(the import statements that run when the module is imported, those inside a function body)."""
    top: list[ast.stmt] = []
    local: list[ast.stmt] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (local if in_function else top).append(child)
            elif _is_type_checking(child) and not in_function:
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]), False)
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return top, local


class _Package:
    """The modules of one package under `root` and, for each, what it imports at its top and in functions."""

    def __init__(self, root: Path, package: str):
        self.root = root
        self.files = {_module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}
        self.package = package
        self.trees = {name: ast.parse(path.read_text(), str(path)) for name, path in self.files.items()}
        self.top = {name: _imports(tree)[0] for name, tree in self.trees.items()}

    def targets(self, importer: str, node: ast.stmt) -> list[str]:
        """The dotted names an import statement loads: modules, and for `from m import x`, m.x too (it may be
        a submodule; an attribute's dotted name simply matches no file)."""
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = importer if self.files[importer].name == "__init__.py" else importer.rpartition(".")[0]
        if node.level:
            base = ".".join(base.split(".")[: len(base.split(".")) - node.level + 1])
            module = ".".join(part for part in (base, node.module) if part)
        else:
            module = node.module
        return [module, *(f"{module}.{alias.name}" for alias in node.names)]

    def _ours(self, name: str) -> list[str]:
        """The package's modules that loading `name` runs: each parent package's __init__, then the module."""
        parts = name.split(".")
        return [dotted for i in range(1, len(parts) + 1) if (dotted := ".".join(parts[:i])) in self.files]

    def closure(self, names: list[str]) -> tuple[set[str], set[str]]:
        """(this package's modules, other dotted names) that importing `names` runs, following every
        module's top-level imports transitively."""
        ours: set[str] = set()
        others: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            if name.split(".")[0] != self.package:
                others.add(name)
                continue
            for module in self._ours(name):
                if module not in ours:
                    ours.add(module)
                    todo.extend(target for node in self.top[module] for target in self.targets(module, node))
        return ours, others


def _heavy(names: set[str], heavy=tuple(HEAVY)) -> list[str]:
    """The names among `names` that are (in) a heavy package: HEAVY, or LOADS_TORCH if given."""
    return sorted(name for name in names if any(name == h or name.startswith(h + ".") for h in heavy))


def _extras(pyproject: Path) -> tuple[set[str], set[str]]:
    """(core dependencies, packages of the optional extras but `dev`), as import names."""
    project = tomllib.loads(pyproject.read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("-", "_") for req in requirements}

    extras = {req for key, reqs in project["optional-dependencies"].items() if key != "dev" for req in reqs}
    return names(project["dependencies"]), names(sorted(extras))


def _reason_holds(
    pkg: _Package, importer: str, node: ast.stmt, reason: str, core: set[str], extras: set[str]
) -> tuple[bool, str]:
    """(whether `reason` holds for the function-local import `node` of module `importer`, why not)."""
    names = pkg.targets(importer, node)
    first = names[0].split(".")[0]
    ours = first == pkg.package
    if reason == "cycle":
        return ours and importer in pkg.closure(names)[0], f"the top-level imports of {names[0]} never reach {importer}"
    if reason == "torch-free":
        importer_loads, loads = pkg.closure([importer])[1], pkg.closure(names)[1] if ours else set(names)
        torch_now, torch_then = _heavy(importer_loads, LOADS_TORCH), _heavy(loads, LOADS_TORCH)
        heavy_now, heavy_then = _heavy(importer_loads), _heavy(loads)
        if not heavy_then:
            return False, f"{names[0]} loads none of HEAVY"
        if torch_now:
            return False, f"{importer} loads {torch_now} at its top already"
        if heavy_now and not torch_then:
            return False, f"{names[0]} loads no torch, and {importer} loads {heavy_now} at its top already"
        return True, ""
    if reason == "optional extra":
        return (
            not ours and first in extras and first not in core,
            f"{first} is not a package of pyproject.toml's optional extras (or is a core dependency)",
        )
    return (
        first in PLATFORM and first in sys.stdlib_module_names,
        f"{first} is not a platform-specific standard-library module (PLATFORM)",
    )


def _local_import_problems(root: Path, package: str, core: set[str], extras: set[str]) -> list[str]:
    """Every function-local import without a `# local: <reason>` tag on its first line, or whose reason is
    false, and every tag left on an import that runs at the top; one line each, naming file and line."""
    pkg = _Package(root, package)
    problems = []
    for importer, path in pkg.files.items():
        source = path.read_text()
        comments = {
            token.start[0]: token.string
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        }
        top, local = _imports(pkg.trees[importer])

        def where(node: ast.stmt) -> str:
            return f"{path.relative_to(root)}:{node.lineno}"

        tags = {
            node.lineno: [
                m.group(1) for part in comments.get(node.lineno, "").split("#") if (m := _LOCAL_TAG.match(part.strip()))
            ]
            for node in top + local
        }
        for node in top:
            if tags[node.lineno]:
                problems.append(f"{where(node)}: a top-level import carries `# local: ...`: drop the tag")
        for node in local:
            statement = ast.get_source_segment(source, node).splitlines()[0]
            if len(tags[node.lineno]) != 1 or tags[node.lineno][0] not in LOCAL_REASONS:
                problems.append(
                    f"{where(node)}: `{statement}` is inside a function without one `# local: <reason>` "
                    f"({' / '.join(LOCAL_REASONS)}) on its first line: move it to the module's top-level imports, "
                    "or tag it with the reason that holds"
                )
                continue
            reason = tags[node.lineno][0]
            reached, why = _reason_holds(pkg, importer, node, reason, core, extras)
            if not reached:
                problems.append(
                    f"{where(node)}: `{statement}` says `# local: {reason}`, but {why}: "
                    "move it to the module's top-level imports, or tag it with the reason that holds"
                )
    return problems


def test_the_local_import_checker_tells_a_true_reason_from_a_false_one(tmp_path):
    """Guards against the local-import rule below passing vacuously: on a small package, a true cycle, a
    true torch-free import (torch into a light module, or into one that loads transformers but no torch),
    an optional extra and a platform module pass, while an untagged import, a false cycle, a torch-free
    import into a module that loads torch anyway, one of math_verify into a module that loads transformers
    already, a core dependency called an extra and a tag on a top-level import are each named with their
    file and line."""
    files = {
        "__init__.py": "",
        "a.py": "from pkg import b\n\ndef f():\n    from pkg import c  # local: cycle\n",
        "b.py": "from pkg.sub import d\n",
        "sub/__init__.py": "from pkg.sub import d\n",
        "sub/d.py": "import json\n",
        "c.py": (
            "import pkg.a\n\n"
            "def g():\n"
            "    from pkg.sub import d  # local: cycle\n"
            "    import torch  # local: torch-free\n"
            "    import textarena  # noqa: F401  # local: optional extra\n"
            "    import fcntl  # local: platform\n"
            "    import json\n"
            "    import yaml  # local: optional extra\n"
        ),
        "e.py": "import torch  # local: torch-free\n\ndef h():\n    from transformers import (  # local: torch-free\n        AutoModel,\n    )\n",
        "t.py": (
            "from transformers.utils import get_json_schema\n\n"
            "def k():\n"
            "    import torch  # local: torch-free\n"
            "    import math_verify  # local: torch-free\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    problems = _local_import_problems(tmp_path, "pkg", core={"torch", "yaml"}, extras={"textarena"})
    found = sorted(problem.split(": `")[0].split(": a top")[0] for problem in problems)
    assert found == ["pkg/c.py:4", "pkg/c.py:8", "pkg/c.py:9", "pkg/e.py:1", "pkg/e.py:4", "pkg/t.py:5"], problems
    assert "c.py:8: `import json` is inside a function without" in "\n".join(problems), problems
    assert "pkg.e loads ['torch'] at its top already" in "\n".join(problems), problems
    assert "math_verify loads no torch, and pkg.t loads ['transformers.utils'" in "\n".join(problems), problems


def test_every_function_local_import_states_a_true_reason():
    """Guards against function-local imports that hide an edge for no reason (issue 68: 194 in 44 files,
    127 of our modules, 57 of third-party packages and 10 of the standard library; 125 had no reason and
    moved to the top): each import inside a function must say on its first line why it is not at the top
    (`# local: cycle`, `torch-free`, `optional extra` or `platform`), and the reason must hold against the
    imports the modules make at their top today."""
    core, extras = _extras(PACKAGE.parents[1] / "pyproject.toml")
    problems = _local_import_problems(PACKAGE.parent, "agentic_rl", core, extras)
    assert not problems, f"{len(problems)} function-local imports without a true reason:\n" + "\n".join(problems)
