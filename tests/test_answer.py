"""Final-answer extraction and numeric equivalence."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_rl.envs import answer
from agentic_rl.envs.answer import answers_match, extract_final_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step 1: 48/2 = 24\nStep 2: 48+24 = 72\nFinal Answer: 72", "72"),
        ("Final Answer: 1,200", "1200"),
        ("Final Answer: $1,200.50.", "1200.50"),
        ("Final Answer: 18 dollars", "18"),
        ("Final Answer: 35 apples.", "35"),
        ("Final Answer: 25%", "25"),
        ("Final Answer: -3", "-3"),
        ("Final Answer: \\boxed{42}", "42"),
        ("Final Answer: $\\boxed{1,000}$", "1000"),
        ("Final Answer: 3/4", "3/4"),
        ("Final Answer: 48 + 24 = 72", "72"),
        ("final answer: 7", "7"),
        ("**Final Answer:** 9", "9"),
        ("Final Answer:\n\n  15\n", "15"),
        ("Final Answer: 5\nFinal Answer: 6", "6"),
        ("Final Answer: \\frac{1}{2}", "\\frac{1}{2}"),
    ],
)
def test_extract_final_answer_cleans_the_last_answer(text: str, expected: str) -> None:
    """Guards against grading the wrong text: the last `Final Answer:` wins, and units, $, commas, %, markdown
    and \\boxed are stripped."""
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize("text", ["The answer is 72.", "", "Final Answer:", "Final Answer:   \n  \n", "Answer: 5"])
def test_extract_final_answer_is_none_without_an_answer(text: str) -> None:
    """Guards against a missing answer being graded (format_ok must then be False)."""
    assert extract_final_answer(text) is None


@pytest.mark.parametrize(
    ("predicted", "reference", "expected"),
    [
        ("72", "72", True),
        ("72.0", "72", True),
        ("72.00", "72", True),
        ("1,200", "1200", True),
        ("0.5", "1/2", True),
        ("$5", "5", True),
        ("71", "72", False),
        ("72.1", "72", False),
        ("-72", "72", False),
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{3}{4}", "0.5", False),
        ("seventy-two", "72", False),
        (None, "72", False),
        ("", "72", False),
    ],
)
def test_answers_match_compares_numerically(predicted, reference: str, expected: bool) -> None:
    """Guards against string-equal grading: 72.0, 1,200, $5 and 1/2 match their numeric values, while near
    misses, signs, words and None do not."""
    assert answers_match(predicted, reference) is expected


def test_plain_numbers_never_reach_math_verify(monkeypatch) -> None:
    """Guards against the slow sympy path (about 2 ms a pair) running for plain numbers."""

    def fail(*_args):
        raise AssertionError("math-verify called for plain numbers")

    monkeypatch.setattr(answer, "_math_verify_match", fail)
    assert answers_match("1,200.0", "1200")
    assert not answers_match("3", "4")


def test_math_verify_path_works_off_the_main_thread() -> None:
    """Guards against math-verify's signal-based timeout failing in a worker thread."""
    results = []
    thread = threading.Thread(target=lambda: results.append(answers_match("\\frac{1}{2}", "0.5")))
    thread.start()
    thread.join()
    assert results == [True]


@settings(max_examples=200, deadline=None)
@given(
    st.fractions(min_value=-(10**7), max_value=10**7, max_denominator=1).map(int)
    | st.decimals(min_value=-(10**6), max_value=10**6, places=2, allow_nan=False, allow_infinity=False),
    st.sampled_from(["{}", "${}", "{} dollars", "\\boxed{{{}}}", "{}.", "**{}**"]),
    st.booleans(),
)
def test_formatted_numbers_round_trip_through_extraction(value, wrapper: str, commas: bool) -> None:
    """Guards against formatting ($, units, boxes, thousands separators) breaking grading."""
    text = f"{value:,}" if commas else str(value)
    reference = str(Fraction(str(value)))
    extracted = extract_final_answer(f"Step 1: done\nFinal Answer: {wrapper.format(text)}")
    assert answers_match(extracted, reference), (text, extracted, reference)
    assert not answers_match(extracted, str(Fraction(str(value)) + 1))
