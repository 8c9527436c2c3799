"""`agentic-rl serve` under abuse: what one client may make the server read, hold or wait for (ServeConfig.http).

The real app and uvicorn in-process on the scripted model of tests/helpers_serve.py, driven with
raw sockets where a client misbehaves below HTTP (bodies it never sends, headers it never finishes)
and with the official `openai` client elsewhere. Every refusal is OpenAI-shaped; none is a 500."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from helpers_serve import scripted_server

from agentic_rl.serving import request_body, server
from agentic_rl.serving.config import HTTPLimits

REPLY = [["It is 24.<|im_end|>"]]
QUESTION = [{"role": "user", "content": "What is 48/2?"}]


def _connect(client: openai.OpenAI) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", client.base_url.port))
    sock.settimeout(3.0)  # every expected answer comes within 2 s; old code never answered: the test fails, not hangs
    return sock


def _head(content_length: int | None = None, chunked: bool = False) -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"Content-Length: {content_length}"] if content_length is not None else []
    lines += ["Transfer-Encoding: chunked"] if chunked else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """(status, headers, JSON body) of one HTTP response read from `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or pytest.fail(f"the server closed the connection without a response: {data!r}")
    head, body = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in header_lines)}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(status_line.split()[1]), headers, json.loads(body)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes `sock` (EOF) within `seconds`."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(qwen3_tokenizer):
    """Guards against the 20 MB body that the old server read whole and parsed on the event loop (other
    requests waited ~40 s, memory grew 5 GB): a body over http.max_body_bytes must be refused from its
    Content-Length alone, and a chunked one as soon as the bytes passed the limit."""
    limits = HTTPLimits(max_body_bytes=64 * 1024)
    with scripted_server(qwen3_tokenizer, REPLY, http=limits) as (client, _):
        with _connect(client) as sock:  # 20 MB declared, not one byte of it sent
            sock.sendall(_head(content_length=20_000_000))
            status, _, body = _response(sock)
        assert status == 413 and body["error"]["code"] == "request_too_large" and "65,536" in body["error"]["message"]

        with _connect(client) as sock:  # chunked: no Content-Length; 5 chunks of 16 KiB pass the limit, no end chunk
            sock.sendall(_head(chunked=True) + b"".join(b"4000\r\n" + b" " * 16384 + b"\r\n" for _ in range(5)))
            status, _, body = _response(sock)
        assert status == 413 and "while it streamed" in body["error"]["message"]

        with pytest.raises(openai.APIStatusError) as caught:  # the official client gets it as an API error
            client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "x" * 100_000}])
        assert caught.value.status_code == 413 and caught.value.body["code"] == "request_too_large"
        assert (
            client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.content
            == "It is 24."
        )


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "body, what",
    [
        (
            "[" * 200_000,
            "the request body nests",
        ),  # the case, scaled to the limit: RecursionError in json.loads (a 500)
        (
            json.dumps(
                {
                    "model": "scripted",
                    "messages": QUESTION,
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": json.loads(_nested(100))}}],
                }
            ),
            "the request body nests arrays and objects 104 levels",
        ),  # parses, but tojson recurses on it
        (
            json.dumps(
                {
                    "model": "scripted",
                    "messages": [
                        *QUESTION,
                        {
                            "role": "assistant",
                            "tool_calls": [
                                {
                                    "id": "c",
                                    "type": "function",
                                    "function": {"name": "calculator", "arguments": '{"a": ' + _nested(5000) + "}"},
                                }
                            ],
                        },
                    ],
                }
            ),
            "'messages[1].tool_calls[0].function.arguments' nests",
        ),  # RecursionError in the arguments' json.loads (a 500)
        (
            json.dumps(
                {
                    "model": "scripted",
                    "messages": [
                        *QUESTION,
                        {
                            "role": "assistant",
                            "tool_calls": [
                                {
                                    "id": "c",
                                    "type": "function",
                                    "function": {"name": "calculator", "arguments": '{"a": ' + _nested(100) + "}"},
                                }
                            ],
                        },
                    ],
                }
            ),
            "'messages[1].tool_calls[0].function.arguments' nests arrays and objects 101 levels",
        ),  # parses; dumped again for the prompt
    ],
)
def test_json_nested_past_the_limit_is_a_400_never_a_500(qwen3_tokenizer, body, what):
    """Guards against the 500 from a RecursionError that 20 MB of `[` gave, and against nesting that parses
    but breaks later (the chat template renders tool schemas with a recursive tojson)."""
    with scripted_server(qwen3_tokenizer, REPLY, http=HTTPLimits(max_body_bytes=2**20)) as (client, _):
        request = urllib.request.Request(
            f"{client.base_url}chat/completions", data=body.encode(), headers={"content-type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request)
        assert caught.value.code == 400, caught.value.read()[:2000]
        error = json.load(caught.value)["error"]
        assert (
            error["code"] == "json_too_deep"
            and error["message"].startswith(what)
            and "http.max_json_depth" in error["message"]
        )
        assert (
            client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.content
            == "It is 24."
        )


def test_a_connection_that_never_finishes_its_headers_is_closed(qwen3_tokenizer):
    """Guards against connections held open forever: uvicorn's only timer (keep-alive) starts after a
    response, so a client that never sends a request, or trickles its headers a byte at a time
    (slowloris), kept its connection for good."""
    with scripted_server(qwen3_tokenizer, REPLY, http=HTTPLimits(read_timeout_s=0.5)) as (client, _):
        with _connect(client) as silent, _connect(client) as trickle:
            started = time.monotonic()
            try:
                for byte in _head(content_length=2):  # a byte every 0.1 s: each one reset uvicorn's keep-alive timer
                    trickle.sendall(bytes([byte]))
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed while it trickled
            assert _closed_within(trickle, 0.1) and 0.4 < time.monotonic() - started < 1.5
            assert _closed_within(silent, 0.1)
        assert (
            client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.content
            == "It is 24."
        )


def test_an_idle_keep_alive_connection_is_closed_after_idle_timeout_s(qwen3_tokenizer):
    """Guards against http.idle_timeout_s being documented but unused (uvicorn's own default is 5 s)."""
    with scripted_server(qwen3_tokenizer, REPLY, http=HTTPLimits(idle_timeout_s=0.3)) as (client, _):
        with _connect(client) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _response(sock)[0] == 200
            assert _closed_within(sock, 1.5)


def test_a_body_that_stalls_is_answered_408(qwen3_tokenizer):
    """Guards against a request whose body never arrives holding its slot (and its bytes) forever."""
    with scripted_server(qwen3_tokenizer, REPLY, http=HTTPLimits(read_timeout_s=0.5)) as (client, _):
        with _connect(client) as sock:
            sock.sendall(_head(content_length=1000) + b'{"model": ')
            started = time.monotonic()
            status, headers, body = _response(sock)
        assert (
            status == 408
            and body["error"]["code"] == "request_timeout"
            and "http.read_timeout_s" in body["error"]["message"]
        )
        assert 0.4 < time.monotonic() - started < 2.0 and headers["connection"] == "close"


def test_requests_past_the_in_flight_limit_are_answered_429_at_once(qwen3_tokenizer):
    """Guards against an unbounded number of requests held at once (each may hold a body of
    max_body_bytes): past http.max_concurrent_requests the server answers 429 with Retry-After, and a
    finished request, failed or not, frees its place."""
    with scripted_server(qwen3_tokenizer, REPLY, http=HTTPLimits(max_concurrent_requests=1, read_timeout_s=1.0)) as (
        client,
        _,
    ):
        with pytest.raises(openai.BadRequestError):  # a refused request frees its place too
            client.chat.completions.create(model="scripted", messages=QUESTION, temperature=-1)
        assert (
            client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.content
            == "It is 24."
        )
        with _connect(client) as holder:
            holder.sendall(_head(content_length=1000) + b"{")  # in flight: its body is being read
            time.sleep(0.2)
            with pytest.raises(openai.RateLimitError) as caught:
                client.chat.completions.create(model="scripted", messages=QUESTION)
            assert (
                caught.value.response.headers["retry-after"] == "1"
                and "http.max_concurrent_requests" in caught.value.message
            )
            assert _response(holder)[0] == 408
        assert (
            client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.content
            == "It is 24."
        )


def test_the_event_loop_answers_other_requests_while_a_body_is_parsed(qwen3_tokenizer, monkeypatch):
    """Guards against parsing and checking a body on the event loop, where a large one stalled every
    other request (the old server parsed a 20 MB body inline). Checking is made to take 1.5 s here;
    /health must answer meanwhile."""
    original = request_body.parse_chat_request

    def slow_parse(*args, **kwargs):
        time.sleep(1.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(request_body, "parse_chat_request", slow_parse)
    monkeypatch.setattr(server, "parse_chat_request", slow_parse, raising=False)  # where the old server called it
    with scripted_server(qwen3_tokenizer, REPLY) as (client, _):
        replies = []
        slow = threading.Thread(
            target=lambda: replies.append(client.chat.completions.create(model="scripted", messages=QUESTION))
        )
        slow.start()
        time.sleep(0.3)  # the slow request is being checked now
        started = time.monotonic()
        assert urllib.request.urlopen(str(client.base_url).replace("/v1/", "/health")).status == 200
        assert time.monotonic() - started < 0.5, "the event loop waited for the slow request's parsing"
        slow.join()
        assert replies[0].choices[0].message.content == "It is 24."


def test_a_request_that_breaks_its_engine_batch_fails_alone(qwen3_tokenizer):
    """Guards against one bad request failing every request batched with it: a lone surrogate in a
    message (the chat format cannot encode it) made its whole engine batch raise, and every good
    request in it got a 500 too. The batch is run again one request at a time. (The server now
    refuses that text when it parses the body; this is the guard for whatever else raises.)"""
    from helpers_serve import LIMITS, ScriptRunner

    from agentic_rl.envs.base import Task
    from agentic_rl.models.chat_format import ChatFormat
    from agentic_rl.rollout.backend import RunnerBackend
    from agentic_rl.rollout.engine import EpisodeOptions, RolloutEngine
    from agentic_rl.rollout.sampling import SamplingParams
    from agentic_rl.serving.batcher import EngineWorker
    from agentic_rl.serving.episodes import ClientToolsEnv

    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    script = qwen3_tokenizer("It is 24.<|im_end|>", add_special_tokens=False)["input_ids"]
    engine = RolloutEngine(
        RunnerBackend(ScriptRunner([script], len(qwen3_tokenizer)), chat_format),
        chat_format,
        qwen3_tokenizer,
        LIMITS,
        SamplingParams(temperature=1.0),
    )
    worker = EngineWorker(engine, max_concurrent=4, batch_window_s=1.0)  # both submissions land in one batch
    try:
        contents = {"good": "What is 48/2?", "bad": "a\ud800b", "also good": "And 50/2?"}
        futures = {
            name: worker.submit(
                ClientToolsEnv([{"role": "user", "content": text}], []),
                Task(name, text, ""),
                EpisodeOptions(sampling=SamplingParams(temperature=1.0, seed=1)),
            )
            for name, text in contents.items()
        }
        for name in ("good", "also good"):
            trajectory = futures[name].result(timeout=120)
            reply = [token for token, mask in zip(trajectory.input_ids, trajectory.loss_mask) if mask]
            assert qwen3_tokenizer.decode(reply) == "It is 24.<|im_end|>"
        with pytest.raises(TypeError, match="TextEncodeInput"):  # the tokenizer's own error, raised in the engine
            futures["bad"].result(timeout=120)
        assert worker.batch_sizes[0] == 3  # they did share the batch that failed
    finally:
        worker.stop()


@pytest.mark.parametrize(
    "body, message, param",
    [
        (
            '{"model": "scripted", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "the request body: messages[0].content holds a lone surrogate",
            "messages[0].content",
        ),
        (
            '{"model": "scripted", "messages": [{"role": "assistant", "role": "user", "content": "hi"}]}',
            "the request body is not valid JSON: the key 'role' appears twice in one object",
            None,
        ),
    ],
)
def test_a_body_with_text_that_is_not_unicode_or_a_repeated_key_is_a_400_naming_it(
    qwen3_tokenizer, body, message, param
):
    """Guards against a lone surrogate being a 500 (the tokenizer's TypeError) and a repeated key
    keeping its last value silently (the message's role decided by whichever came last)."""
    with scripted_server(qwen3_tokenizer, REPLY) as (client, _):
        request = urllib.request.Request(
            f"{client.base_url}chat/completions", data=body.encode(), headers={"content-type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request)
        assert caught.value.code == 400
        error = json.load(caught.value)["error"]
        assert error["message"].startswith(message) and error["param"] == param, error


def _in_flight(client: openai.OpenAI) -> int:
    with urllib.request.urlopen(str(client.base_url).replace("/v1/", "/health")) as response:
        return json.loads(response.read())["in_flight"]


@pytest.mark.parametrize("stream", [False, True])
def test_requests_whose_clients_went_away_are_cancelled_and_free_their_places(qwen3_tokenizer, stream):
    """Guards against requests sent and abandoned decoding on to their end (64 of them kept the next
    client at 429 for 75 s): a client that hangs up cancels its episode at the engine's next step.
    Here each abandoned request would decode 900 tokens at 10 ms a forward (9 s)."""
    rambling = [["word " * 1000]]  # never ends its turn: it decodes to max_tokens
    body = json.dumps({"model": "scripted", "messages": QUESTION, "max_tokens": 900, "stream": stream}).encode()
    with scripted_server(qwen3_tokenizer, rambling, http=HTTPLimits(max_concurrent_requests=2), forward_s=0.01) as (
        client,
        _,
    ):
        abandoned = [_connect(client) for _ in range(2)]
        for sock in abandoned:
            sock.sendall(_head(content_length=len(body)) + body)
        time.sleep(0.5)
        assert _in_flight(client) == 2  # both decoding
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="scripted", messages=QUESTION, max_tokens=5)
        for sock in abandoned:
            sock.close()
        hung_up = time.monotonic()
        while _in_flight(client) and time.monotonic() - hung_up < 5:
            time.sleep(0.02)
        assert time.monotonic() - hung_up < 1.0, "the abandoned requests kept their places"
        reply = client.chat.completions.create(model="scripted", messages=QUESTION, max_tokens=5)
        assert (
            reply.choices[0].finish_reason == "length"
            and reply.choices[0].message.content == "word word word word word"
        )


def test_a_request_of_more_messages_than_the_limit_is_a_400_before_it_is_rendered(qwen3_tokenizer, monkeypatch):
    """Guards against a request of 100k two-character messages (3.4 MB, under the body limit) rendered
    whole before any check, stalling the server for as long: past http.max_messages it is a 400."""
    from agentic_rl.models.chat_format import ChatFormat

    messages = [{"role": role, "content": "hi"} for _ in range(1000) for role in ("user", "assistant")] + QUESTION
    with scripted_server(qwen3_tokenizer, REPLY) as (client, _):
        monkeypatch.setattr(
            ChatFormat, "render", lambda *args, **kwargs: pytest.fail("rendered before the count was checked")
        )
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="scripted", messages=messages)
    assert caught.value.body["param"] == "messages" and caught.value.body["code"] == "too_many_messages"
    assert "holds 2,001 messages; this server accepts at most 1,024 (http.max_messages)" in caught.value.message


def test_large_bodies_take_turns_to_parse_while_small_ones_parse_at_once(qwen3_tokenizer, monkeypatch):
    """Guards against 16 concurrent 3.9 MiB bodies of `[{},{},...]` parsed all at once: RSS 0.55 -> 3.5
    GiB, small requests waiting up to 33 s. Bodies over 64 KiB parse within http.max_parsing_bytes
    (here room for one), each made to take 0.5 s; a small request is answered meanwhile."""
    original, active, most, lock = request_body.decode_chat_request, [0], [0], threading.Lock()

    def slow(raw, *args):
        large = len(raw) > request_body.SMALL_BODY_BYTES
        if large:
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.5)
        try:
            return original(raw, *args)
        finally:
            if large:
                with lock:
                    active[0] -= 1

    monkeypatch.setattr(server, "decode_chat_request", slow)
    flood = ("[" + ",".join(["{}"] * 30_000) + "]").encode()  # 90 KB of empty objects
    with scripted_server(qwen3_tokenizer, REPLY, http=HTTPLimits(max_parsing_bytes=100_000)) as (client, _):
        statuses = []

        def send_flood():
            with _connect(client) as sock:
                sock.settimeout(10.0)
                sock.sendall(_head(content_length=len(flood)) + flood)
                statuses.append(_response(sock)[0])

        floods = [threading.Thread(target=send_flood) for _ in range(3)]
        for thread in floods:
            thread.start()
        time.sleep(0.2)  # the first is parsing, the others wait their turn
        started = time.monotonic()
        assert (
            client.chat.completions.create(model="scripted", messages=QUESTION).choices[0].message.content
            == "It is 24."
        )
        assert time.monotonic() - started < 0.4, "a small request waited for the large bodies"
        for thread in floods:
            thread.join()
    assert statuses == [400, 400, 400] and most[0] == 1
