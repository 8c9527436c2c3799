"""The calculator tool: exact results, limits, and refusal of anything but arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_rl.tools.base import Tool, ToolError
from agentic_rl.tools.calculator import calculator, evaluate, format_number


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("48/2", "24"),
        ("48 + 24", "72"),
        ("100 - 7", "93"),
        ("6 * 7", "42"),
        ("3 × 4", "12"),
        ("12 ÷ 8", "1.5"),
        ("7 − 10", "-3"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("17 % 5", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "0.25"),
        ("(48 + 12) / 5", "12"),
        ("-(3 - 5) * 2", "4"),
        ("0.2 * 50", "10"),
        ("12.50+12.50+5.00", "30"),
        ("1/3", "0.3333333333"),
        ("2/3", "0.6666666667"),
        ("3/4 + 1/4", "1"),
        (".25/.05", "5"),
        ("1e3 + 1", "1001"),
        ("1000000000000.5", "1000000000000.5"),
        ("4 ** 0.5", "2"),
        ("48/2=", "24"),
        ("  48 / 2 =  ", "24"),
    ],
)
def test_calculator_computes_the_exact_value(expression: str, expected: str) -> None:
    """Guards against float noise and parse gaps in the calculator tool: exact results for unicode operators,
    floor division, powers, decimals and a trailing '='."""
    assert calculator(expression) == expected


def test_decimal_sum_is_exact_not_float() -> None:
    """Guards against float evaluation: 0.1 + 0.2 must not print 0.30000000000000004."""
    assert calculator("0.1 + 0.2") == "0.3"
    assert evaluate("0.1 + 0.2") == Fraction(3, 10)
    assert evaluate("0.1 + 0.2 - 0.3") == 0


@pytest.mark.parametrize(
    ("expression", "message_part"),
    [
        ("1/0", "division by zero"),
        ("5 // (2 - 2)", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 100", "overflow"),
        ("10 ** 30", "overflow"),
        ("99999999999999 * 99999999999999 * 99999", "overflow"),
        ("2 ** 101", "exponent 101 is too large"),
        ("1e400", "too large"),
        ("((1/999999)**50)**50", "precision"),
        ("1" * 201, "200-character limit"),
        ("", "empty expression"),
        ("=", "empty expression"),
        ("2 +", "invalid syntax"),
        ("2 x 3", "invalid syntax"),
        ("2^3", "use ** for powers"),
        ("1,000", "write 1000 instead of 1,000"),
        ("1,000,000 + 5", "only one expression"),
        ("1, 2", "only one expression"),
        ("(-8) ** (1/3)", "not a real number"),
    ],
)
def test_calculator_reports_bad_input_and_limits_as_tool_errors(expression: str, message_part: str) -> None:
    """Guards against a tool call that crashes the episode or hangs on huge numbers: division by zero, overflow,
    bad syntax and limits become ToolErrors with a hint."""
    with pytest.raises(ToolError, match=message_part.replace("(", r"\(").replace("*", r"\*").replace("^", r"\^")):
        calculator(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('echo hi')",
        "abs(-2)",
        "(1).real",
        "x + 1",
        "lambda: 1",
        "[1, 2]",
        "{1: 2}",
        "'a' * 3",
        "1 < 2",
        "1 and 2",
        "True + 1",
        "1 if 1 else 2",
        "(yield)",
        "[x for x in (1,)]",
        "1 << 100",
        "~1",
        "f'{1}'",
        "2j",
    ],
)
def test_calculator_rejects_everything_but_arithmetic(expression: str) -> None:
    """Guards against code execution: names, calls, attributes, lambdas, strings never run."""
    with pytest.raises(ToolError):
        calculator(expression)


def test_hostile_nesting_of_powers_fails_fast() -> None:
    """Guards against a 200-character expression that builds a million-digit integer."""
    import time

    start = time.perf_counter()
    for expression in ["9**99**99", "(2**99)**99", "((1/3)**100)**100", "-" * 199 + "1"]:
        try:
            calculator(expression)
        except ToolError:
            pass
    assert time.perf_counter() - start < 0.5


def test_format_number_strips_zeros_and_keeps_integers() -> None:
    """Guards against tool results like '5.0' or long decimals that the model would copy: integers stay
    integers, tiny values use short scientific notation."""
    assert format_number(Fraction(5, 1)) == "5"
    assert format_number(Fraction(-5, 2)) == "-2.5"
    assert format_number(Fraction(1, 8)) == "0.125"
    assert format_number(Fraction(1, 3 * 10**7)) == "3.333333333e-8"


def test_calculator_schema_comes_from_its_signature_and_docstring() -> None:
    """Guards against a tool schema out of step with the function: its parameters and description come from the
    signature and docstring, and the Tool calls it."""
    tool = Tool.from_function(calculator, name="calculator")
    parameters = tool.schema["function"]["parameters"]
    assert parameters["properties"]["expression"]["type"] == "string"
    assert parameters["required"] == ["expression"]
    assert "arithmetic" in tool.schema["function"]["description"]
    assert tool.call({"expression": "6*7"}) == "42"


@settings(max_examples=200, deadline=None)
@given(
    st.integers(-(10**6), 10**6),
    st.sampled_from(["+", "-", "*", "/", "//", "%"]),
    st.integers(-(10**6), 10**6),
)
def test_binary_operations_agree_with_exact_python_arithmetic(left: int, op: str, right: int) -> None:
    """Guards against operator mix-ups and precedence bugs in the AST walker."""
    expression = f"{left} {op} ({right})"
    if right == 0 and op in ("/", "//", "%"):
        with pytest.raises(ToolError):
            evaluate(expression)
        return
    exact = {
        "+": lambda: Fraction(left) + right,
        "-": lambda: Fraction(left) - right,
        "*": lambda: Fraction(left) * right,
        "/": lambda: Fraction(left, right),
        "//": lambda: Fraction(left // right),
        "%": lambda: Fraction(left % right),
    }[op]
    assert evaluate(expression) == exact()


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_arbitrary_text_raises_only_tool_errors(text: str) -> None:
    """Guards against a crash (SyntaxError, RecursionError, TypeError...) leaking out."""
    try:
        result = calculator(text)
    except ToolError:
        return
    assert isinstance(result, str)
