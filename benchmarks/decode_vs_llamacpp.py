"""Our engine's decode step beside llama.cpp's, on the same model, precision, rows and threads, in one run.

    .venv/bin/python benchmarks/decode_vs_llamacpp.py --llama-python LLAMA_VENV/bin/python --gguf MODEL.gguf

LLAMA_VENV is a venv of its own with llama-cpp-python built from source, MODEL.gguf SmolLM2-135M-Instruct
converted to an f32 GGUF (benchmarks/llamacpp_anchor.py says how).

For each setting (rows, cached tokens per row, of them a shared prefix) it times FastRunner's step
(roofline.py's `decode_phase`, fp32, 2 threads) in this process, then llama.cpp's
(benchmarks/llamacpp_anchor.py, in the interpreter that has llama-cpp-python, fp32 weights and K/V
cache, flash attention off), and prints both medians with [min, max] over `--repeats` samples of 8
steps, their tokens/s and the ratio llama.cpp / ours (above 1: llama.cpp is faster). The settings:
the demo's rollout step (32 rows, 448 tokens, 376 of them one prompt shared: the rows of a GRPO
group), the same rows with nothing shared, and one row alone. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import decode_phase  # noqa: E402

from agentic_rl.models.loader import load_model  # noqa: E402

SETTINGS = [(32, 448, 376), (32, 448, 0), (1, 448, 0)]
"""(rows, cached tokens a row, of them a prefix every row shares)."""


def llama_step(python: str, gguf: str, batch: int, context: int, shared: int, repeats: int, kv_unified: str) -> dict:
    """llamacpp_anchor.py's JSON line for one setting."""
    script = Path(__file__).resolve().parent / "llamacpp_anchor.py"
    argv = [python, str(script), "--model", gguf, "--batch", str(batch), "--context", str(context)]
    argv += ["--shared", str(shared), "--repeats", str(repeats), "--threads", str(torch.get_num_threads())]
    argv += ["--kv-unified", kv_unified]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-python", required=True, help="an interpreter with llama-cpp-python")
    parser.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct as an f32 GGUF")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kv-unified", default="auto", help="llamacpp_anchor.py's --kv-unified")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, _ = load_model("smollm2-135m-instruct")
    model.eval()
    print(f"threads {torch.get_num_threads()}, fp32, {args.repeats} samples of 8 steps each")
    print(f"{'rows':>4} {'context':>7} {'shared':>6}  {'ours ms/step':>22}  {'llama.cpp ms/step':>22}  ratio")
    rows = []
    for batch, context, shared in SETTINGS:
        ours = decode_phase(model, batch, context, shared, torch.float32, args.repeats)
        theirs = llama_step(args.llama_python, args.gguf, batch, context, shared, args.repeats, args.kv_unified)
        row = {"rows": batch, "context": context, "shared": shared, "ours": ours, "llama_cpp": theirs}
        rows.append(row)
        o, t = ours["step_s"] * 1e3, theirs["step_s"] * 1e3
        o_range = "[{:.0f}, {:.0f}]".format(*(1e3 * s for s in ours["step_range_s"]))
        t_range = "[{:.0f}, {:.0f}]".format(*(1e3 * s for s in theirs["step_range_s"]))
        print(f"{batch:>4} {context:>7} {shared:>6}  {o:>8.1f} {o_range:>13}  {t:>8.1f} {t_range:>13}  {o / t:.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
