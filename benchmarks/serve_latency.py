"""Latency and throughput of `agentic-rl serve`, measured through the official `openai` client.

    .venv/bin/python benchmarks/serve_latency.py                                  # embedded model, model mode
    .venv/bin/python benchmarks/serve_latency.py --model runs/demo/grpo/final --env arith
    .venv/bin/python benchmarks/serve_latency.py --model tiny-qwen3 --requests 4 --concurrent 4   # smoke run

Starts the server as its own process on a free port (as a user would), waits for it, then:
  sequential  --requests requests one after another: the latency of a lone request (median, min, max)
  concurrent  --concurrent requests at once (threads): wall time, requests/s, generated tokens/s,
              and how many engine batches they took (the server's /health)
Every request is the same arith question, greedy (temperature 0: the same work each time), with
`max_tokens` --max-tokens; `completion_tokens` from each reply's usage counts the tokens decoded.
The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

QUESTION = (
    "A baker makes 48 muffins and sells half of them in the morning. In the afternoon she bakes 3 more. "
    "How many muffins does she have now?"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--env", default=None, help="agent mode: the environment whose tools the server runs")
    parser.add_argument("--requests", type=int, default=8, help="sequential requests")
    parser.add_argument("--concurrent", type=int, default=16, help="requests sent at once")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "agentic_rl.cli",
        "serve",
        "--model",
        args.model,
        "--port",
        str(port),
        "--dtype",
        args.dtype,
        "--max-concurrent",
        str(max(args.concurrent, 1)),
        "--max-turn-tokens",
        str(args.max_tokens),
    ]
    command += ["--env", args.env] if args.env else []
    server = subprocess.Popen(command, env=os.environ.copy())
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
        started = time.perf_counter()
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server exited with {server.returncode}")
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                time.sleep(0.2)
        startup_s = time.perf_counter() - started
        model_id = client.models.list().data[0].id

        def ask(_: int) -> tuple[float, int]:
            begin = time.perf_counter()
            reply = client.chat.completions.create(
                model=model_id,
                messages=[{"role": "user", "content": QUESTION}],
                temperature=0,
                max_tokens=args.max_tokens,
            )
            return time.perf_counter() - begin, reply.usage.completion_tokens

        ask(0)  # warm-up: first-call allocations, lazy imports
        sequential = [ask(i) for i in range(args.requests)]
        latencies = [seconds for seconds, _ in sequential]
        health_before = _health(port)
        begin = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrent) as pool:
            together = list(pool.map(ask, range(args.concurrent)))
        wall = time.perf_counter() - begin
        health_after = _health(port)
    finally:
        server.terminate()
        server.wait(timeout=60)

    tokens_sequential = sum(tokens for _, tokens in sequential)
    tokens_concurrent = sum(tokens for _, tokens in together)
    result = {
        "model": args.model,
        "env": args.env,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "startup_s": round(startup_s, 1),
        "sequential_requests": args.requests,
        "latency_median_s": round(statistics.median(latencies), 3),
        "latency_min_s": round(min(latencies), 3),
        "latency_max_s": round(max(latencies), 3),
        "sequential_tokens_per_s": round(tokens_sequential / sum(latencies), 1),
        "concurrent_requests": args.concurrent,
        "concurrent_wall_s": round(wall, 2),
        "concurrent_requests_per_s": round(args.concurrent / wall, 2),
        "concurrent_tokens_per_s": round(tokens_concurrent / wall, 1),
        "concurrent_latency_median_s": round(statistics.median(seconds for seconds, _ in together), 3),
        "concurrent_engine_batches": health_after["batches"] - health_before["batches"],
        "completion_tokens_per_request": round(tokens_concurrent / args.concurrent, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(f"startup {result['startup_s']} s")
    print(
        f"sequential x{args.requests}: median {result['latency_median_s']} s (min {result['latency_min_s']}, max "
        f"{result['latency_max_s']}), {result['sequential_tokens_per_s']} tok/s"
    )
    print(
        f"concurrent x{args.concurrent}: {result['concurrent_wall_s']} s wall, {result['concurrent_requests_per_s']} req/s, "
        f"{result['concurrent_tokens_per_s']} tok/s, median latency {result['concurrent_latency_median_s']} s, "
        f"{result['concurrent_engine_batches']} engine batch(es)"
    )
    print(json.dumps(result))


def _health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as response:
        return json.load(response)


if __name__ == "__main__":
    main()
