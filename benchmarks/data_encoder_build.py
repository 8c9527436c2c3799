"""Building the data-safe encoder's plain tokenizer: from its parts against a to_str/from_str round trip.

    .venv/bin/python benchmarks/data_encoder_build.py [--repeats 7]

Every ChatFormat (each rollout engine, SFT and RM data build, audit, serve) builds one
DataSafeEncoder, which needs the tokenizer without its added vocabulary (models/data_tokens.py).
Two ways, side by side in one run, for the vendored Qwen3 tokenizer (151k vocabulary) and
SmolLM2's (49k):
  round trip  to_str() → drop added tokens, post-processor, padding, truncation → from_str
              (the encoder until 2026-12-03);
  parts       `models.data_tokens.plain_tokenizer`: Tokenizer(backend.model) with the backend's
              normalizer, pre-tokenizer and decoder (the model shared, not copied).
Each is built --repeats times: median and range in ms, the ratio of the medians, and a check that
both encode a set of texts (control-token strings, whitespace, non-ASCII) to the same ids.
The last line is JSON with every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tokenizers import Tokenizer

from agentic_rl.models import load_tokenizer
from agentic_rl.models.data_tokens import plain_tokenizer as parts

TEXTS = [
    "hi <|im_end|> there\n<|im_start|>assistant\n",
    'Step 1: 57 - 30.\n<tool_call>\n{"a": 1}\n</tool_call>',
    "émoji 🙂 and  tabs\t\t ok",
    "<think>\n\n</think>\n\n",
    "  leading and trailing  ",
    "12,345.67 * 0.5",
]


def round_trip(backend: Tokenizer) -> Tokenizer:
    spec = json.loads(backend.to_str())
    spec.update(added_tokens=[], post_processor=None, padding=None, truncation=None)
    return Tokenizer.from_str(json.dumps(spec))


def timed(build, backend: Tokenizer, repeats: int) -> tuple[list[float], Tokenizer]:
    times, built = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        built = build(backend)
        times.append((time.perf_counter() - started) * 1000)
    return times, built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = {}
    for name in ("tiny-qwen3", "smollm2-135m-instruct"):
        backend = load_tokenizer(name).backend_tokenizer
        old_times, old = timed(round_trip, backend, args.repeats)
        new_times, new = timed(parts, backend, args.repeats)
        same = all(
            old.encode(t, add_special_tokens=False).ids == new.encode(t, add_special_tokens=False).ids for t in TEXTS
        )
        row = {
            "round_trip_ms": statistics.median(old_times),
            "round_trip_range_ms": [min(old_times), max(old_times)],
            "parts_ms": statistics.median(new_times),
            "parts_range_ms": [min(new_times), max(new_times)],
            "same_ids": same,
        }
        row["ratio"] = row["round_trip_ms"] / row["parts_ms"]
        rows[name] = row
        print(
            f"{name:24s} round trip {row['round_trip_ms']:8.1f} ms [{min(old_times):.1f}, {max(old_times):.1f}]   "
            f"parts {row['parts_ms']:7.3f} ms [{min(new_times):.3f}, {max(new_times):.3f}]   "
            f"{row['ratio']:,.0f}x   same ids: {same}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
