"""The `calculator` tool: exact arithmetic on one expression, evaluated by walking its AST.

    calculator("48/2")          -> "24"
    calculator("0.1 + 0.2")     -> "0.3"        (exact: every number is a fractions.Fraction)
    calculator("(3 × 4) ÷ 8")   -> "1.5"        (× and ÷ are accepted and mean * and /)
    calculator("1/3")           -> "0.3333333333"
    calculator("2**200")        -> ToolError: exponent 200 is too large; the limit is |exponent| <= 100

The expression is parsed with `ast.parse(mode="eval")` and only a whitelist of node types is
evaluated (numbers, + - * / // % **, unary +/-, parentheses). There is no eval/exec, no names,
no calls, no attributes: `__import__('os')` is rejected as a call before anything runs.

Limits keep a hostile expression cheap: at most 200 characters, exponents with |e| <= 100,
every intermediate value below 1e30 in magnitude, and at most ~4000 bits of numerator or
denominator. Every failure raises `ToolError` with a message the model can act on.

Departures from Python: `^` is rejected with a hint to use `**` (Python would XOR), "1,000" is
rejected with a hint to write 1000 (Python would build a tuple), and a trailing "=" is dropped
("48/2=" is how models often write a calculation).
"""

from __future__ import annotations

import ast
import decimal
import math
import operator
from fractions import Fraction
from typing import Callable

from agentic_rl.tools.base import ToolError, register_tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_MAGNITUDE = Fraction(10**30)
MAX_BITS = 4000
"""Bound on the bit length of any numerator or denominator (about 1200 decimal digits)."""
SIGNIFICANT_DIGITS = 10

_NORMALIZE = {"×": "*", "÷": "/", "−": "-", "–": "-", "·": "*"}

_BINARY_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}

_REJECTED_NODE_HINTS: dict[type, str] = {
    ast.Name: "names/variables are not allowed; write the numbers themselves",
    ast.Call: "function calls are not allowed; use only numbers and + - * / // % ** ( )",
    ast.Attribute: "attribute access is not allowed; use only numbers and operators",
    ast.Subscript: "indexing is not allowed; use only numbers and operators",
    ast.Lambda: "lambdas are not allowed; use only numbers and operators",
    ast.Compare: "comparisons are not allowed; the calculator only computes a value",
    ast.BoolOp: "and/or are not allowed; use only + - * / // % **",
    ast.List: "lists are not allowed; compute one expression at a time",
}


@register_tool("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports + - * / (also × and ÷), // (floor division), % (remainder), ** (power),
    parentheses, negative numbers, decimals and fractions such as 3/4. Results are exact:
    0.1 + 0.2 gives 0.3. Non-integer results are shown with up to 10 significant digits.

    Args:
        expression: One arithmetic expression using numbers only, e.g. "(48 + 12) / 5".

    Returns:
        The value as text, e.g. "12".
    """
    value = evaluate(expression)
    return format_number(value)


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; raises ToolError on bad input or a limit hit."""
    text = _normalize(expression)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        hint = " (use ** for powers, not ^)" if "^" in text else ""
        raise ToolError(
            f"invalid syntax in expression {text!r}{hint}; write plain arithmetic such as "
            "(48 + 12) / 5 using numbers, + - * / // % ** and parentheses"
        ) from None
    return _eval_node(tree.body, text)


def _normalize(expression: str) -> str:
    text = expression.strip()
    for symbol, replacement in _NORMALIZE.items():
        text = text.replace(symbol, replacement)
    text = text.rstrip("= \t\n")  # "48/2=" -> "48/2"
    if not text:
        raise ToolError("empty expression; pass one arithmetic expression such as 48/2")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(
            f"expression is {len(text)} characters, over the {MAX_EXPRESSION_CHARS}-character "
            "limit; split the calculation into smaller steps"
        )
    return text


def _eval_node(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.Constant):
        return _checked(_literal(node, source))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _eval_node(node.operand, source)
        return operand if isinstance(node.op, ast.UAdd) else -operand
    if isinstance(node, ast.BinOp):
        left = _eval_node(node.left, source)
        right = _eval_node(node.right, source)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        op = _BINARY_OPS.get(type(node.op))
        if op is None:
            hint = " (use ** for powers)" if isinstance(node.op, ast.BitXor) else ""
            raise ToolError(f"operator {type(node.op).__name__} is not supported{hint}; allowed: + - * / // % **")
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ToolError(f"division by zero in {ast.get_source_segment(source, node)!r}")
        return _checked(op(left, right))
    if isinstance(node, ast.Tuple):
        raise ToolError(_tuple_message(node, source))
    hint = _REJECTED_NODE_HINTS.get(type(node), "use only numbers, + - * / // % ** and parentheses")
    raise ToolError(f"unsupported element {type(node).__name__} in expression: {hint}")


def _literal(node: ast.Constant, source: str) -> Fraction:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolError(f"unsupported constant {value!r}; only numbers are allowed")
    if isinstance(value, int):
        return Fraction(value)
    if not math.isfinite(value):
        raise ToolError(f"number {ast.get_source_segment(source, node)!r} is too large")
    # Read the decimal from the source text so 0.1 is exactly 1/10, not the nearest float.
    segment = (ast.get_source_segment(source, node) or "").replace("_", "")
    try:
        return Fraction(segment)
    except ValueError:
        return Fraction(repr(value))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        if base < 0:
            raise ToolError("a negative number to a fractional power is not a real number")
        if base == 0:
            return Fraction(0)
        try:
            result = float(base) ** float(exponent)
        except OverflowError:
            raise ToolError(_too_large_message()) from None
        if abs(result) >= float(MAX_MAGNITUDE):
            raise ToolError(_too_large_message())
        return Fraction(repr(result))
    power = exponent.numerator
    if abs(power) > MAX_EXPONENT:
        raise ToolError(f"exponent {power} is too large; the limit is |exponent| <= {MAX_EXPONENT}")
    if base == 0:
        if power < 0:
            raise ToolError("division by zero: 0 raised to a negative power")
        return Fraction(0) if power else Fraction(1)
    # Predict the size before computing so 99**100 never gets built.
    log10_result = power * (math.log10(base.numerator if base > 0 else -base.numerator) - math.log10(base.denominator))
    if log10_result >= 30:
        raise ToolError(_too_large_message())
    bits = abs(power) * max(base.numerator.bit_length(), base.denominator.bit_length())
    if bits > MAX_BITS:
        raise ToolError(_precision_message())
    return base**power


def _checked(value: Fraction) -> Fraction:
    if abs(value) >= MAX_MAGNITUDE:
        raise ToolError(_too_large_message())
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise ToolError(_precision_message())
    return value


def _too_large_message() -> str:
    return "overflow: a value in the calculation reaches 1e30 or more; the limit is |value| < 1e30"


def _precision_message() -> str:
    return f"a value needs more than {MAX_BITS} bits of precision; simplify the calculation"


def _tuple_message(node: ast.Tuple, source: str) -> str:
    segment = ast.get_source_segment(source, node) or source
    looks_like_thousands = all(
        isinstance(elt, ast.Constant) and isinstance(elt.value, int) for elt in node.elts
    ) and all(len(part.strip()) == 3 for part in segment.split(",")[1:])
    if looks_like_thousands:
        return (
            f"commas are not allowed in numbers: write {segment.replace(',', '').replace(' ', '')} instead of {segment}"
        )
    return "only one expression at a time; make a separate call for each calculation"


def format_number(value: Fraction) -> str:
    """An integer as digits; otherwise a decimal with all integer digits and at least 10
    significant digits, rounded half-even, trailing zeros stripped, never scientific for
    magnitudes from 1e-6 up.
    """
    if value.denominator == 1:
        return str(value.numerator)
    integer_digits = len(str(abs(value.numerator) // value.denominator))
    context = decimal.Context(prec=max(SIGNIFICANT_DIGITS, integer_digits + 6))
    rounded = context.divide(decimal.Decimal(value.numerator), decimal.Decimal(value.denominator))
    if abs(rounded) >= decimal.Decimal("1e-6") or rounded == 0:
        text = format(rounded, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text
    return format(rounded.normalize(), "e")
