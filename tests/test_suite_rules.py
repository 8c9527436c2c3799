"""The rules of this test suite (STYLE.md section 9), read from the test files with `ast`:

- no test module imports another (shared helpers live in conftest.py and tests/helpers_*.py), not
  even in the code string of a subprocess;
- every test function has a docstring naming what it guards;
- tests/INVARIANTS.md names only tests that exist, under every invariant of docs/design.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
INVARIANTS = TESTS / "INVARIANTS.md"
DESIGN = TESTS.parent / "docs" / "design.md"
# docs/design.md's invariants, as its "## Invariants" section numbers them: "1. **Token-in-token-out.**"
HEADINGS = re.findall(
    r"^(\d+)\. \*\*(.+?)\.\*\*",
    DESIGN.read_text().split("## Invariants", 1)[1].split("\n## ", 1)[0],
    flags=re.MULTILINE,
)
# `import test_x`, `from test_x import y`, `import_module("test_x")`, also inside a string (a subprocess's code)
TEST_MODULE_IN_TEXT = re.compile(r"\bimport\s+test_\w+|\bfrom\s+test_\w+\s+import\b|import_module\(\s*['\"]test_\w+")
REFERENCE = re.compile(r"\b(test_\w+\.py)::(test_\w+)")


def _python_files() -> list[Path]:
    return sorted(TESTS.glob("*.py"))


def imported_test_modules(source: str, strings: bool = True) -> list[str]:
    """The test modules `source` imports: import statements, and (`strings`) import lines inside its string
    constants, such as the code a test hands to a subprocess."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0].startswith("test_")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0].startswith("test_"):
            found.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("test_")
        ):
            found.append(node.args[0].value)
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [match.group(0) for match in TEST_MODULE_IN_TEXT.finditer(node.value)]
    return found


def _test_functions(tree: ast.Module):
    """The functions pytest collects: module-level `test*` functions and `test*` methods of `Test*` classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                    yield f"{node.name}::{item.name}", item


def undocumented_tests(source: str) -> list[str]:
    return [name for name, node in _test_functions(ast.parse(source)) if not (ast.get_docstring(node) or "").strip()]


def missing_references(index: str, sources: dict[str, str]) -> list[str]:
    """`file::test` entries of the index whose file is not among `sources` or does not define that test."""
    defined = {
        name: {test.split("::")[-1] for test, _ in _test_functions(ast.parse(text))} for name, text in sources.items()
    }
    return [f"{file}::{test}" for file, test in REFERENCE.findall(index) if test not in defined.get(file, set())]


def test_no_test_module_imports_another():
    """Guards against test modules that import each other for their helpers: running one file then runs
    (and registers) another's module, helpers hide inside test files, and a rename breaks far-away tests."""
    this = Path(__file__).resolve()  # its own strings are the broken examples below; its statements count
    offenders = {
        path.name: found
        for path in _python_files()
        for found in [imported_test_modules(path.read_text(), strings=path != this)]
        if found
    }
    assert not offenders, f"move the shared helpers to tests/helpers_*.py or conftest.py: {offenders}"


def test_every_test_function_says_what_it_guards():
    """Guards against tests without a docstring (STYLE.md 9: a test's docstring names the bug it guards
    against), so a failing test says what broke."""
    missing = {
        path.name: names
        for path in sorted(TESTS.glob("test_*.py"))
        for names in [undocumented_tests(path.read_text())]
        if names
    }
    assert not missing, f"add a one-line docstring naming the bug each test guards against: {missing}"


def test_the_invariants_index_names_only_tests_that_exist():
    """Guards against an INVARIANTS.md that points at renamed or deleted tests, and against an invariant of
    docs/design.md losing every test that proves it."""
    index = INVARIANTS.read_text()
    sources = {path.name: path.read_text() for path in TESTS.glob("test_*.py")}
    missing = missing_references(index, sources)
    assert not missing, f"INVARIANTS.md names tests that do not exist: {missing}"
    sections = re.split(r"^## ", index, flags=re.MULTILINE)[1:]
    assert [tuple(s.splitlines()[0].split(". ", 1)) for s in sections[: len(HEADINGS)]] == HEADINGS
    for number, heading in HEADINGS:
        (section,) = [s for s in sections if heading in s.splitlines()[0]] or [""]
        assert REFERENCE.search(section), f"INVARIANTS.md has no test under '{heading}'"


def test_the_design_the_code_cites_is_in_the_repository():
    """Guards against code citing a design document a clone does not have (the code cited a DESIGN.md
    outside the repository 29 times), and against a citation of an invariant docs/design.md lacks."""
    repo = TESTS.parent
    files = [
        *repo.glob("src/**/*.py"),
        *repo.glob("tests/*.py"),
        *repo.glob("benchmarks/*.py"),
        *repo.glob("tests/*.md"),
    ]
    cited = {path.relative_to(repo).as_posix(): path.read_text() for path in files if path != Path(__file__)}
    assert len(HEADINGS) == 9
    assert not [name for name, text in cited.items() if re.search(r"(?<!docs/)\bDESIGN(\.md)?\b", text)]
    numbers = {int(n) for text in cited.values() for n in re.findall(r"docs/design\.md invariants? (\d+)", text)}
    assert numbers and numbers <= {int(number) for number, _ in HEADINGS}, numbers


def test_the_rules_catch_a_broken_suite():
    """Guards against rules that pass vacuously: each one must flag a small broken example."""
    importing = (
        "import test_grpo_trainer\nfrom test_ppo_trainer import _cfg\nimport helpers_training\n"
        "script = 'import sys\\nimport test_ppo_trainer as t\\n'\nimportlib.import_module('test_serve')\n"
    )
    assert sorted(imported_test_modules(importing)) == [
        "import test_ppo_trainer",
        "test_grpo_trainer",
        "test_ppo_trainer",
        "test_serve",
    ]
    assert imported_test_modules("import helpers_training\nfrom sigkill import run_until\nx = 'no test_x here'\n") == []
    undocumented = 'def test_a():\n    """Guards."""\n\ndef test_b():\n    pass\n\nclass TestC:\n    def test_d(self):\n        pass\n'
    assert undocumented_tests(undocumented) == ["test_b", "TestC::test_d"]
    index = "- test_a.py::test_here — ok\n- test_a.py::test_gone — renamed\n- test_z.py::test_here — no such file\n"
    assert missing_references(index, {"test_a.py": "def test_here():\n    pass\n"}) == [
        "test_a.py::test_gone",
        "test_z.py::test_here",
    ]
