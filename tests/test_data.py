"""The GSM8K loader: every vendored problem parses, and malformed records name their line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rl import data
from agentic_rl.data import Calculation, DataError, load_gsm8k, vendored_gsm8k_dir

GOOD = {"question": "Q?", "answer": "Half of 48 is 48/2 = <<48/2=24>>24.\nSo 48+24=<<48+24=72>>72.\n#### 1,072"}


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.mark.parametrize(("split", "count"), [("train", 7473), ("test", 1319)])
def test_every_vendored_problem_parses_with_final_answer_and_all_annotations(split: str, count: int) -> None:
    """Guards against problems or annotations silently dropped by the parser.

    The reference counts come from the raw file: lines, and occurrences of "<<".
    """
    problems = load_gsm8k("vendored", split)
    raw = (vendored_gsm8k_dir() / f"{split}.jsonl").read_text()
    assert len(problems) == count == len(raw.splitlines())
    assert [p.index for p in problems] == list(range(count))
    assert sum(len(p.annotations) for p in problems) == raw.count("<<")
    for problem in problems:
        assert problem.final_answer.lstrip("-").replace(".", "").isdigit(), problem
        assert problem.answer_text.rsplit("####", 1)[1].strip().replace(",", "") == problem.final_answer
        assert all(a.expr and a.value for a in problem.annotations)
        assert not any("<<" in line for line in problem.solution_lines)


def test_first_problem_is_split_into_parts() -> None:
    """Guards against a GSM8K parser that mangles the vendored data: the first problem's question, final answer,
    <<calculation>> annotations and solution lines."""
    problem = load_gsm8k()[0]
    assert problem.question.startswith("Natalia sold clips to 48 of her friends")
    assert problem.final_answer == "72"
    assert problem.annotations == (Calculation("48/2", "24"), Calculation("48+24", "72"))
    assert problem.solution_lines == (
        "Natalia sold 48/2 = 24 clips in May.",
        "Natalia sold 48+24 = 72 clips altogether in April and May.",
    )


def test_final_answer_drops_thousands_separators(tmp_path: Path) -> None:
    """Guards against "1,072" reaching the grader, which would compare it as text."""
    problems = load_gsm8k(_write_jsonl(tmp_path / "a.jsonl", [GOOD]))
    assert problems[0].final_answer == "1072"
    assert problems[0].annotations == (Calculation("48/2", "24"), Calculation("48+24", "72"))


def test_directory_source_reads_the_split_file_and_parquet_works(tmp_path: Path) -> None:
    """Guards against a user GSM8K folder being read from the wrong split file, or parquet copies being refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _write_jsonl(tmp_path / "test.jsonl", [GOOD, GOOD])
    assert len(load_gsm8k(tmp_path, "test")) == 2
    pq.write_table(pa.Table.from_pylist([GOOD] * 3), tmp_path / "train.parquet")
    problems = load_gsm8k(tmp_path, "train")
    assert len(problems) == 3 and problems[2].final_answer == "1072"


@pytest.mark.parametrize(
    ("bad_record", "message_part"),
    [
        ("{not json", "not valid JSON"),
        ({"question": "Q?"}, "missing or empty string field 'answer'"),
        ({"answer": "#### 5"}, "missing or empty string field 'question'"),
        ({"question": "Q?", "answer": "It is 5."}, "last line must be '#### <number>'"),
        ({"question": "Q?", "answer": "It is 5.\n#### five"}, "must hold one number"),
        ({"question": "Q?", "answer": "It is <<2+3>>5.\n#### 5"}, "not of the form <<expression=value>>"),
        ({"question": "Q?", "answer": "It is <<2+3=5.\n#### 5"}, "unbalanced"),
        ({"question": "Q?", "answer": "It is <<2+3=5=5>>5.\n#### 5"}, "not of the form"),
        ([1, 2], "expected a JSON object"),
        ("", "empty line"),
    ],
)
def test_malformed_record_names_file_and_line(tmp_path: Path, bad_record, message_part: str) -> None:
    """Guards against bad records being skipped silently or reported without a location."""
    path = _write_jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, bad_record, GOOD])
    with pytest.raises(DataError, match=message_part.replace("(", r"\(")) as error:
        load_gsm8k(path)
    assert f"{path}:3:" in str(error.value)


def test_missing_vendored_copy_says_where_it_looked(tmp_path: Path, monkeypatch) -> None:
    """Guards against a missing vendored GSM8K copy surfacing as a bare FileNotFoundError instead of saying what
    is missing."""
    monkeypatch.setattr(data, "vendored_gsm8k_dir", lambda: tmp_path / "nowhere")
    data._load_cached.cache_clear()
    try:
        with pytest.raises(DataError, match="vendored GSM8K copy is missing"):
            load_gsm8k("vendored", "train")
    finally:
        data._load_cached.cache_clear()


def test_unknown_source_and_split_are_rejected(tmp_path: Path) -> None:
    """Guards against a typo'd source path or split silently loading something else (e.g. another split) instead
    of failing."""
    with pytest.raises(DataError, match="is not 'vendored'"):
        load_gsm8k(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="unknown GSM8K split"):
        load_gsm8k("vendored", "validation")
