"""GSM8K loading: the vendored copy, any local JSONL/Parquet file, or the hub id.

    problems = load_gsm8k()                          # vendored data/gsm8k/train.jsonl, 7,473 problems
    problems = load_gsm8k(split="test")              # 1,319 problems
    problems = load_gsm8k("my/gsm8k_dir", "test")    # <dir>/test.jsonl or <dir>/test.parquet
    problems = load_gsm8k("extra.parquet")           # one file: read as is (split unused)
    problems = load_gsm8k("openai/gsm8k")            # datasets.load_dataset (needs the network)

Each record needs `question` and `answer`. The answer is the worked solution; its calculator
annotations `<<48/2=24>>` become `Calculation`s and its last line `#### 72` the final answer.
A malformed record raises `DataError` naming the file, the 1-based line (or row) and the fix:
nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any, Iterator

import agentic_rl

HUB_ID = "openai/gsm8k"
SPLITS = ("train", "test")
_ANNOTATION = re.compile(r"<<(.*?)>>", re.DOTALL)


class DataError(ValueError):
    """A data file is missing or malformed; the message names the file, line and fix."""


@dataclasses.dataclass(frozen=True)
class Calculation:
    """One GSM8K calculator annotation `<<expr=value>>`."""

    expr: str
    """The expression left of the "=", e.g. "48/2"."""
    value: str
    """The annotated result right of it, e.g. "24" (as written; not re-computed)."""


@dataclasses.dataclass(frozen=True)
class GSM8KProblem:
    """One GSM8K problem with its solution split into parts."""

    index: int
    """0-based position in its file."""
    question: str
    answer_text: str
    """The full solution as in the file, annotations and `####` line included."""
    final_answer: str
    """The number after `####`, commas removed, e.g. "1200"."""
    annotations: tuple[Calculation, ...]
    """Every `<<expr=value>>` in the solution, in order."""
    solution_lines: tuple[str, ...]
    """The solution lines before `####`, with the `<<...>>` annotations removed."""


def vendored_gsm8k_dir() -> Path:
    """`<repo>/data/gsm8k`, found from the package location (src layout)."""
    return Path(agentic_rl.__file__).resolve().parents[2] / "data" / "gsm8k"


def load_gsm8k(source: str | Path = "vendored", split: str = "train") -> list[GSM8KProblem]:
    """Load and parse GSM8K problems.

    Args:
        source: "vendored" (the copy in `<repo>/data/gsm8k`), "openai/gsm8k" (the hub, via
            `datasets`), a directory holding `<split>.jsonl` or `<split>.parquet`, or a single
            `.jsonl`/`.parquet` file (then `split` is not used).
        split: "train" or "test" for the vendored copy, the hub and directories.

    Raises:
        DataError: a file is missing or a record is malformed.
    """
    return list(_load_cached(str(source), split))


@functools.lru_cache(maxsize=8)
def _load_cached(source: str, split: str) -> tuple[GSM8KProblem, ...]:
    if source == HUB_ID:
        return tuple(_parse_records(_hub_records(split), f"{HUB_ID}[{split}]"))
    path = _resolve_path(source, split)
    records = _parquet_records(path) if path.suffix == ".parquet" else _jsonl_records(path)
    problems = tuple(_parse_records(records, str(path)))
    if not problems:
        raise DataError(f"{path}: no problems in the file (it is empty); add one JSON object per line")
    return problems


def _resolve_path(source: str, split: str) -> Path:
    if source == "vendored":
        directory = vendored_gsm8k_dir()
        if not directory.is_dir():
            raise DataError(
                f"the vendored GSM8K copy is missing: expected {directory}/{{train,test}}.jsonl. "
                "Run from a source checkout (pip install -e .) or pass a path or 'openai/gsm8k'"
            )
        source = str(directory)
    path = Path(source)
    if path.is_dir():
        if split not in SPLITS:
            raise DataError(f"unknown GSM8K split {split!r}; use one of {SPLITS}")
        for suffix in (".jsonl", ".parquet"):
            candidate = path / f"{split}{suffix}"
            if candidate.is_file():
                return candidate
        raise DataError(f"no {split}.jsonl or {split}.parquet in {path}")
    if not path.is_file():
        raise DataError(f"GSM8K source {source!r} is not 'vendored', {HUB_ID!r}, a directory or a file")
    return path


def utf8_lines(
    path: Path, error: type[Exception] | None = None, max_bytes: int | None = None
) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 text file. A missing file or a line that is
    not UTF-8 raises `error` (DataError by default) naming the file, the line and the byte; so does
    a line longer than `max_bytes`, before more of it than that is read."""
    error = error or DataError
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        lines = iter(lambda: handle.readline(-1 if max_bytes is None else max_bytes + 2), b"")
        for line_number, raw in enumerate(lines, start=1):
            if max_bytes is not None and len(raw.rstrip(b"\r\n")) > max_bytes:
                raise error(
                    f"{path}:{line_number}: the line is longer than {max_bytes} bytes, the most one line may "
                    "hold; split it"
                )
            try:
                yield line_number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(
                    f"{path}:{line_number}: not UTF-8 text (byte {exc.start + 1} of the line is "
                    f"{raw[exc.start : exc.start + 1]!r}); re-save the file as UTF-8"
                ) from None


def _jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    for line_number, line in utf8_lines(path):
        if not line.strip():
            raise DataError(f"{path}:{line_number}: empty line; remove it")
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # also: too deeply nested, integers too long
            message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or type(exc).__name__
            raise DataError(
                f"{path}:{line_number}: not valid JSON ({message}); each line must be one "
                'object {"question": ..., "answer": ...}'
            ) from None
        yield line_number, record


def _parquet_records(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq  # local: torch-free

    for row_number, row in enumerate(pq.read_table(path).to_pylist(), start=1):
        yield row_number, row


def _hub_records(split: str) -> Iterator[tuple[int, Any]]:
    import datasets  # local: torch-free

    dataset = datasets.load_dataset(HUB_ID, "main", split=split)
    for row_number, row in enumerate(dataset, start=1):
        yield row_number, row


def _parse_records(records: Iterator[tuple[int, Any]], origin: str) -> Iterator[GSM8KProblem]:
    for index, (line_number, record) in enumerate(records):
        where = f"{origin}:{line_number}"
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object with question and answer")
        for key in ("question", "answer"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise DataError(f"{where}: missing or empty string field {key!r}; add it")
        yield parse_problem(index, record["question"], record["answer"], where)


def parse_problem(index: int, question: str, answer: str, where: str = "<record>") -> GSM8KProblem:
    """Split one GSM8K solution into annotations, lines and the `####` final answer."""
    lines = answer.rstrip("\n").split("\n")
    final_line = lines[-1].strip()
    if not final_line.startswith("####"):
        raise DataError(f"{where}: the answer's last line must be '#### <number>', got {final_line[:60]!r}")
    final_answer = final_line[4:].strip().replace(",", "")
    if not re.fullmatch(r"-?\d+(\.\d+)?", final_answer):
        raise DataError(f"{where}: the '####' line must hold one number, got {final_line!r}")
    body = "\n".join(lines[:-1])
    if body.count("<<") != body.count(">>"):
        raise DataError(f"{where}: unbalanced '<<' / '>>' in the solution; close each annotation")
    annotations = parse_annotations(body, where)
    solution_lines = tuple(_ANNOTATION.sub("", line).strip() for line in lines[:-1] if line.strip())
    return GSM8KProblem(index, question, answer, final_answer, annotations, solution_lines)


def parse_annotations(text: str, where: str = "<text>") -> tuple[Calculation, ...]:
    """Every `<<expr=value>>` in `text`, in order; DataError if one is not of that form."""
    return tuple(_parse_annotation(match.group(1), where) for match in _ANNOTATION.finditer(text))


def _parse_annotation(inner: str, where: str) -> Calculation:
    expr, sep, value = inner.partition("=")
    if not sep or "=" in value or not expr.strip() or not value.strip():
        raise DataError(f"{where}: annotation <<{inner}>> is not of the form <<expression=value>>; fix it")
    return Calculation(expr.strip(), value.strip())
