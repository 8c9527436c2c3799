"""llama.cpp's decode step on the same model, precision, batch and threads as FastRunner's: an anchor (issue 66).

    LLAMA_VENV/bin/python benchmarks/llamacpp_anchor.py --model MODEL.gguf
    ... --batch 1 --shared 0                  # one row alone
    ... --batch 32 --context 430 --shared 0   # rows with nothing in common

It needs llama-cpp-python (built from source with -DGGML_NATIVE=ON -DGGML_BLAS=OFF; not a project
dependency: run it with a venv that has it, not .venv) and SmolLM2-135M-Instruct converted to an f32
GGUF (llama.cpp's convert_hf_to_gguf.py --outtype f32). Run it alone on the machine: every figure is
a rate, and anything beside it takes its share.

What it measures, with llama.cpp's own C API (llama_batch_init / llama_decode, through ctypes): one
context whose KV cache holds `--batch` sequences, fp32 weights and (by default) an fp32 K/V cache,
`--threads` threads for both single-token and batched evaluation. Every row holds `--context` cached
tokens, of which the first `--shared` are one prefix: decoded once into sequence 0 and copied into
every other sequence with llama_memory_seq_cp. In the unified KV cache (one buffer for all rows,
which `--kv-unified auto` picks when there is a prefix) the copy shares the cells, so the prefix is
stored once, as FastRunner's fork does; each row's attention then runs over every used cell of that
buffer, masking the cells that are not its own. `--kv-unified off` gives every row a buffer of its
own, into which the copy writes the prefix again. Then one llama_decode appends one token to every row, with
logits for every row (the LM head runs on all of them, as the engine's step does), and
llama_synchronize waits for it. The token ids are roofline.py's: prefix token j is (7j mod 1000) + 1,
row i's own token j is ((11i + j) mod 1000) + 1, and every step feeds token 5 to every row.

A sample is `--steps` consecutive steps (as roofline.py times them), after one warm-up sample; a
step's time is the sample's over `--steps`, reported as the median and [min, max] over `--repeats`
samples, with rows × steps / time as tokens/s. The rows grow by one token a step, so the cache is
sized for context + steps × (repeats + 1) tokens a row.

Attention runs llama.cpp's plain fp32 path by default (`--flash-attn off`): with its CPU flash
attention on (which llama.cpp's own default, auto, picks on this CPU), the log-probs of a chat prompt
moved by up to 1.8e-2 from transformers' fp32 forward, as with an f16 K/V cache, against 6e-5 with
it off; so `--flash-attn on` is a different precision from FastRunner's fp32, to be reported apart.

A check (outside the timing; `--no-verify` skips it) decodes the first and the last row again, alone, in
a fresh context, and prints the largest difference between those logits and the batched step's:
a check that the rows, their positions and the shared prefix are what the timed steps ran on.

The last line is JSON with every number.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from typing import Any, Callable

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp as C

STEP_TOKEN = 5
GGML_TYPE = {"f32": 0, "f16": 1}  # enum ggml_type
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # enum llama_flash_attn_type


def _median_range(run: Callable[[], Any], repeats: int) -> tuple[float, float, float]:
    """(median, min, max) seconds of `run()` after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def row_tokens(row: int, context: int, shared: int) -> list[int]:
    """Row `row`'s cached tokens: the shared prefix, then its own (roofline.py's ids)."""
    prefix = [(7 * j) % 1000 + 1 for j in range(shared)]
    return prefix + [(11 * row + j) % 1000 + 1 for j in range(context - shared)]


def load_model(path: str) -> Any:
    params = C.llama_model_default_params()
    params.n_gpu_layers = 0
    model = C.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def new_context(
    model: Any, n_seq: int, n_ctx: int, threads: int, kv_type: str, flash_attn: str, kv_unified: bool
) -> Any:
    """A context for `n_seq` sequences sharing `n_ctx` cache cells (each gets n_ctx / n_seq unless unified)."""
    params = C.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = 512
    params.n_ubatch = 512
    params.n_seq_max = n_seq
    params.n_threads = threads
    params.n_threads_batch = threads
    params.type_k = GGML_TYPE[kv_type]
    params.type_v = GGML_TYPE[kv_type]
    params.flash_attn_type = FLASH_ATTN[flash_attn]
    params.kv_unified = kv_unified
    params.no_perf = True
    ctx = C.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create the context")
    return ctx


def fill(batch: Any, entries: list[tuple[int, int, int, bool]]) -> None:
    """Write (token, position, sequence, wants logits) entries into a llama_batch from llama_batch_init."""
    for i, (token, pos, seq, logits) in enumerate(entries):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits
    batch.n_tokens = len(entries)


def decode(ctx: Any, batch: Any, entries: list[tuple[int, int, int, bool]]) -> None:
    """llama_decode in chunks of at most n_batch entries, then wait for it."""
    step = C.llama_n_batch(ctx)
    for start in range(0, len(entries), step):
        fill(batch, entries[start : start + step])
        rc = C.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
    C.llama_synchronize(ctx)


def prefill(ctx: Any, batch: Any, rows: int, context: int, shared: int) -> None:
    """The shared prefix once into sequence 0, copied into the others; then every row's own tokens."""
    if shared:
        decode(ctx, batch, [(t, j, 0, False) for j, t in enumerate(row_tokens(0, shared, shared))])
        memory = C.llama_get_memory(ctx)
        for row in range(1, rows):
            C.llama_memory_seq_cp(memory, 0, row, -1, -1)
    own = [
        (t, shared + j, row, j == context - shared - 1)
        for row in range(rows)
        for j, t in enumerate(row_tokens(row, context, shared)[shared:])
    ]
    decode(ctx, batch, own)


def step_logits(ctx: Any, rows: list[int], n_vocab: int) -> np.ndarray:
    """The logits of the last decode's outputs `rows` (by output index), as (len(rows), n_vocab)."""
    return np.stack([np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in rows])


def verify(model: Any, args: argparse.Namespace, steps_done: int, batched: np.ndarray, n_vocab: int) -> float:
    """Largest |logit| difference between the batched step's first and last rows and each row decoded alone."""
    worst = 0.0
    for out, row in ((0, 0), (1, args.batch - 1)):
        tokens = row_tokens(row, args.context, args.shared) + [STEP_TOKEN] * steps_done
        ctx = new_context(model, 1, len(tokens) + 16, args.threads, args.kv_type, args.flash_attn, False)
        batch = C.llama_batch_init(512, 0, 1)
        try:
            decode(ctx, batch, [(t, j, 0, j == len(tokens) - 1) for j, t in enumerate(tokens)])
            alone = step_logits(ctx, [-1], n_vocab)[0]
        finally:
            C.llama_batch_free(batch)
            C.llama_free(ctx)
        worst = max(worst, float(np.abs(alone - batched[out]).max()))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the f32 GGUF of SmolLM2-135M-Instruct")
    parser.add_argument("--batch", type=int, default=32, help="rows decoded together (1: one row alone)")
    parser.add_argument("--context", type=int, default=448, help="cached tokens per row when a step is timed")
    parser.add_argument("--shared", type=int, default=376, help="of those, one prefix every row shares (0: none)")
    parser.add_argument("--steps", type=int, default=8, help="consecutive decode steps in one timed sample")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples, after one warm-up sample")
    parser.add_argument("--threads", type=int, default=2, help="n_threads and n_threads_batch")
    parser.add_argument("--kv-type", choices=sorted(GGML_TYPE), default="f32", help="K/V cache precision")
    parser.add_argument(
        "--flash-attn",
        choices=sorted(FLASH_ATTN),
        default="off",
        help="llama.cpp's flash attention (auto turns it on for this CPU); not fp32-exact: see above",
    )
    parser.add_argument(
        "--kv-unified",
        choices=["auto", "on", "off"],
        default="auto",
        help="one cache buffer for all rows (auto: on when there is a shared prefix, so it is stored once)",
    )
    parser.add_argument("--no-verify", dest="verify", action="store_false")
    parser.add_argument("--verbose", action="store_true", help="llama.cpp's own log")
    args = parser.parse_args()
    if not 0 <= args.shared < args.context:
        parser.error("--shared must be at least 0 and below --context")
    if not 1 <= args.batch <= 256:
        parser.error("--batch must be 1 to 256 (llama.cpp's LLAMA_MAX_SEQ)")
    logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    unified = args.shared > 0 if args.kv_unified == "auto" else args.kv_unified == "on"

    C.llama_backend_init()
    model = load_model(args.model)
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
    per_row = args.context + args.steps * (args.repeats + 1) + 16
    ctx = new_context(model, args.batch, args.batch * per_row, args.threads, args.kv_type, args.flash_attn, unified)
    batch = C.llama_batch_init(max(512, args.batch), 0, 1)
    position = args.context

    def decode_steps() -> None:
        nonlocal position
        for _ in range(args.steps):
            decode(ctx, batch, [(STEP_TOKEN, position, row, True) for row in range(args.batch)])
            position += 1

    try:
        start = time.perf_counter()
        prefill(ctx, batch, args.batch, args.context, args.shared)
        prefill_s = time.perf_counter() - start
        median, low, high = _median_range(decode_steps, args.repeats)
        last = step_logits(ctx, [0, args.batch - 1], n_vocab)
        if not np.isfinite(last).all():
            raise RuntimeError("the batched step produced non-finite logits")
        worst = verify(model, args, position - args.context, last, n_vocab) if args.verify else None
    finally:
        C.llama_batch_free(batch)
        C.llama_free(ctx)

    step_s = median / args.steps
    result = {
        "engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
        "batch": args.batch,
        "context": args.context,
        "shared_prefix": args.shared,
        "threads": args.threads,
        "kv_type": args.kv_type,
        "flash_attn": args.flash_attn,
        "kv_unified": unified,
        "steps": args.steps,
        "repeats": args.repeats,
        "step_s": step_s,
        "step_range_s": [low / args.steps, high / args.steps],
        "tokens_per_s": args.batch / step_s,
        "prefill_s": prefill_s,
        "verify_max_abs_logit_diff": worst,
        "system_info": C.llama_print_system_info().decode().strip(),
    }
    C.llama_model_free(model)
    print(
        f"llama.cpp decode, {args.batch} rows × {args.context} cached ({args.shared} shared), {args.threads} threads: "
        f"{step_s * 1e3:.1f} ms a step [{low / args.steps * 1e3:.1f}, {high / args.steps * 1e3:.1f}], "
        f"{args.batch / step_s:.1f} tok/s"
        + (f"; rows alone differ by at most {worst:.2e} in a logit" if worst is not None else "")
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
