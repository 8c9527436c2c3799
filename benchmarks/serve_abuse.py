"""Small-request latency of `agentic-rl serve` while a client sends 20 MB bodies (loopback, tiny-qwen3, seconds).

    .venv/bin/python benchmarks/serve_abuse.py                 # about 12 s once the server is up
    .venv/bin/python benchmarks/serve_abuse.py --seconds 1     # shorter

Starts `agentic-rl serve --model tiny-qwen3` as its own process on a free loopback port, then runs
the same small request (one user message, greedy, --max-tokens tokens) through the `openai`
client, one after another, for --seconds in each phase:
  alone           nothing else in flight
  content-length  another client sends 20 MB bodies of `[` back to back (one in flight at a time),
                  each with its Content-Length: refused from the header alone
  chunked         the same without Content-Length (chunked): each is read up to http.max_body_bytes
                  (4 MiB by default) before its 413, so this is a flood of 4 MiB reads
Reports, per phase, the small requests' median latency, their spread (p10-p90, max), the ratio of
the medians to the phase alone, the server's CPU seconds per second of the phase, the big
bodies' count, answers and time to the answer, and the server's resident memory before and after.
The sending client runs on the same cores as the server: on a small machine part of any slowdown
is the sender's own CPU.
The last line is JSON with every figure. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import openai

BIG_BYTES = 20_000_000
CHUNK = b"[" * 65536


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each phase")
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args()

    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentic_rl.cli",
            "serve",
            "--model",
            "tiny-qwen3",
            "--port",
            str(port),
            "--max-turn-tokens",
            str(args.max_tokens),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        _wait_ready(client, server)

        def ask() -> float:
            begin = time.perf_counter()
            client.chat.completions.create(
                model="tiny-qwen3",
                messages=[{"role": "user", "content": "What is 48/2 + 3?"}],
                temperature=0,
                max_tokens=args.max_tokens,
            )
            return time.perf_counter() - begin

        for _ in range(3):
            ask()  # warm-up
        rss_before = _rss_mb(server.pid)
        cpu = _cpu_s(server.pid)
        phases = {"alone": (_for(args.seconds, ask), [], _cpu_s(server.pid) - cpu)}
        for mode in ("content-length", "chunked"):
            stop, refusals = threading.Event(), []
            sender = threading.Thread(target=_send_big_bodies, args=(port, mode == "chunked", stop, refusals))
            sender.start()
            time.sleep(0.2)  # the first big body is in flight
            cpu = _cpu_s(server.pid)
            latencies = _for(args.seconds, ask)
            phases[mode] = (latencies, refusals, _cpu_s(server.pid) - cpu)
            stop.set()
            sender.join()
        rss_after = _rss_mb(server.pid)
        still = ask()
    finally:
        server.terminate()
        server.wait(timeout=30)

    alone_median = statistics.median(phases["alone"][0])
    report = {"rss_mb_before": rss_before, "rss_mb_after": rss_after, "small_request_after_s": still}
    print(
        f"{'20 MB bodies':<16} {'n':>4} {'median ms':>10} {'p10-p90 ms':>14} {'max ms':>7} {'ratio':>6} {'server cpu':>10}"
        "   big bodies: n, answers, median/max ms to the answer"
    )
    for name, (latencies, refusals, cpu_s) in phases.items():
        small = _summary(latencies)
        row = {
            "small": small,
            "median_ratio": small["median"] / alone_median,
            "server_cpu_s_per_s": cpu_s / args.seconds,
        }
        line = (
            f"{name:<16} {small['n']:>4} {small['median'] * 1e3:>10.1f} {small['p10'] * 1e3:>6.1f}-{small['p90'] * 1e3:<7.1f} "
            f"{small['max'] * 1e3:>7.1f} {row['median_ratio']:>6.2f} {row['server_cpu_s_per_s']:>9.2f}s"
        )
        if refusals:
            big = _summary([seconds for _, seconds in refusals])
            row.update(
                big_bodies=len(refusals),
                big_statuses=sorted({status for status, _ in refusals}),
                big_time_to_answer_s=big,
            )
            line += f"   {len(refusals)}, {row['big_statuses']}, {big['median'] * 1e3:.1f}/{big['max'] * 1e3:.1f}"
        report[name] = row
        print(line)
    print(
        f"server RSS: {rss_before:.0f} MB before, {rss_after:.0f} MB after; a small request after: {still * 1e3:.1f} ms"
    )
    print(json.dumps(report))


def _send_big_bodies(port: int, chunked: bool, stop: threading.Event, refusals: list[tuple[int, float]]) -> None:
    """20 MB bodies back to back until `stop` (chunked, or with a Content-Length); (status, seconds to the answer) of each."""
    while not stop.is_set():
        head = ["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
        head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {BIG_BYTES}")
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(30)
            begin = time.perf_counter()
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            writer = threading.Thread(target=_write_body, args=(sock, chunked), daemon=True)
            writer.start()  # the body goes out as a client would send it, while the answer is awaited
            status_line = _read_line(sock)
            refusals.append((int(status_line.split()[1]), time.perf_counter() - begin))
            sock.shutdown(socket.SHUT_RDWR)
            writer.join()


def _write_body(sock: socket.socket, chunked: bool) -> None:
    try:
        for _ in range(BIG_BYTES // len(CHUNK)):
            sock.sendall(b"10000\r\n" + CHUNK + b"\r\n" if chunked else CHUNK)
        sock.sendall(b"0\r\n\r\n" if chunked else b"")
    except OSError:
        pass  # the server answered and closed, or we shut the socket: the rest is never sent


def _read_line(sock: socket.socket) -> str:
    data = b""
    while b"\r\n" not in data:
        piece = sock.recv(4096)
        if not piece:
            raise SystemExit(f"the server closed a big-body connection without answering: {data!r}")
        data += piece
    return data.split(b"\r\n", 1)[0].decode()


def _for(seconds: float, ask) -> list[float]:
    end, latencies = time.perf_counter() + seconds, []
    while time.perf_counter() < end:
        latencies.append(ask())
    return latencies


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "n": len(ordered),
        "median": statistics.median(ordered),
        "p10": pick(0.1),
        "p90": pick(0.9),
        "max": ordered[-1],
    }


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(client: openai.OpenAI, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while True:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit("the server did not become ready in 300 s")
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            time.sleep(0.2)


if __name__ == "__main__":
    main()
