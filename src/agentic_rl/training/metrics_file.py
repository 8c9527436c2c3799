"""A run's metrics.jsonl, read back: one strict-JSON object per logged step, `{"step": k,
"loss/total": ..., ...}`, every key defined in training/metric_keys.py, a non-finite value written
as null. `RunDir.log` (training/run_dir.py) writes it; the report, the pipeline and the tests read
it here, without loading torch (the report runs in `agentic-rl report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentic_rl.strict_json import loads_strict


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl file; a null (a non-finite value when logged) reads as NaN."""
    rows = [loads_strict(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [{key: float("nan") if value is None else value for key, value in row.items()} for row in rows]
