"""`agentic-rl serve`: the OpenAI chat-completions API over the rollout engine (Starlette + uvicorn).

    agentic-rl serve --model runs/demo/grpo/final --env arith --port 8000     # agent mode
    agentic-rl serve --model smollm2-135m-instruct                           # model mode

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    reply = client.chat.completions.create(model="runs/demo/grpo/final",
                                           messages=[{"role": "user", "content": "What is 48/2 + 3?"}])

Routes: POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id}, GET /health (readiness,
and how many engine batches ran and how large). Every request is one episode of the engine that
training and evaluation use (same chat format, tool parser, sampler and limits): serving/episodes.py
says how a request becomes an episode, serving/batcher.py how concurrent requests share a batch,
serving/openai_api.py the wire format and its checks. Errors have OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`: 400 for a bad request (the message and `param`
name the field), 404 for an unknown model or route, 413 / 408 for a body over http.max_body_bytes
or slower than http.read_timeout_s, 429 past http.max_concurrent_requests in flight, 500 only when
an episode fails. What one client may cost (body size, JSON nesting, header and idle timeouts) is
`ServeConfig.http`: serving/request_body.py and serving/connections.py enforce it. A client that
hangs up cancels its request: a queued one never runs, a decoding one ends at the engine's next
step, so its slot and its place under http.max_concurrent_requests are free again.

Streaming (`stream: true`, server-sent events ending with `data: [DONE]`) is per turn, not per
token: the engine's backend hands back whole turns, so the reply's content (or its tool calls)
arrives in one chunk when its turn is decoded. In agent mode each turn that called tools is sent
as soon as its tools ran, as a chunk whose extra `tool_trace` field holds that turn's messages;
the reply follows. The first chunk (the assistant role) is sent before decoding starts.

Agent-mode responses carry two extra top-level fields, which OpenAI clients keep as extras:
`tool_trace` (the turns that called tools, as OpenAI assistant and tool messages, in order) and
`episode` ({finish_reason, turns}: why the engine ended the episode).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
import time
import uuid
from typing import Any, AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentic_rl.models.device import load_for_decoding
from agentic_rl.rollout.factory import build_engine
from agentic_rl.serving.batcher import EngineWorker
from agentic_rl.serving.config import HTTPLimits, ServeConfig
from agentic_rl.serving.connections import uvicorn_options
from agentic_rl.serving.episodes import reply, request_episode
from agentic_rl.serving.openai_api import APIError, chunk, completion, stream_deltas
from agentic_rl.serving.request_body import ParseBudget, decode_chat_request, read_body


@dataclasses.dataclass
class ServedModel:
    """What the routes need: the model id, the server's limits, the worker, and the mode."""

    model_id: str
    limits: Any
    """The RolloutConfig every request decodes under (defaults and limits)."""
    worker: EngineWorker
    agent_tools: list[str] | None = None
    """The environment's tools (agent mode), or None (model mode)."""
    seed: int = 0
    """Base seed of requests that name none."""
    http: HTTPLimits = dataclasses.field(default_factory=HTTPLimits)
    """What one client may make the server read, hold or wait for."""
    in_flight: int = 0
    """Chat requests admitted and not yet finished by the engine (bounded by http.max_concurrent_requests)."""
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    _counter: Any = dataclasses.field(default_factory=itertools.count)
    parsing: ParseBudget = dataclasses.field(init=False)
    """The large bodies being parsed (http.max_parsing_bytes)."""

    def __post_init__(self) -> None:
        self.parsing = ParseBudget(self.http)

    @property
    def agent_mode(self) -> bool:
        return self.agent_tools is not None

    def next_seed(self) -> int:
        return self.seed + next(self._counter)

    def release(self) -> None:
        self.in_flight -= 1


def build_app(served: ServedModel) -> Starlette:
    """The ASGI app for `served` (tests run it in-process with a scripted engine)."""

    async def chat_completions(request: Request) -> Response:
        # Held from here until the engine is done with the episode (a client that hangs up does not free it).
        if served.in_flight >= served.http.max_concurrent_requests:
            raise APIError(
                429,
                f"this server has {served.in_flight} requests in flight, its limit (http.max_concurrent_requests); "
                "retry shortly",
                kind="requests",
                code="rate_limit_exceeded",
            )
        served.in_flight += 1  # one event loop: no lock needed
        loop = asyncio.get_running_loop()
        future = None
        try:
            raw = await read_body(request, served.http)
            # Parsing a body of a few MB is tens of ms of Python: on a worker thread, the loop answers the others meanwhile.
            async with served.parsing.hold(len(raw)):
                chat = await run_in_threadpool(
                    decode_chat_request, raw, served.model_id, served.limits, served.agent_mode, served.http
                )
            request_id = f"chatcmpl-{uuid.uuid4().hex}"
            seed = chat.seed if chat.seed is not None else served.next_seed()
            events: asyncio.Queue = asyncio.Queue()

            def on_trace(messages: list[dict[str, Any]]) -> None:  # called on the engine's threads
                if chat.stream:
                    loop.call_soon_threadsafe(events.put_nowait, messages)

            cancel = threading.Event()
            env, task, options = request_episode(
                chat, request_id, seed, served.agent_tools, served.limits.max_turns, on_trace, cancel
            )
            future = served.worker.submit(env, task, options)
        finally:
            if future is None:
                served.in_flight -= 1
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(served.release))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, cancel))
        if not chat.stream:
            try:
                trajectory = await asyncio.wrap_future(future)
            finally:
                _stop_watching(watcher, future, cancel)
            message, finish, tokens = reply(trajectory, chat, served.agent_mode)
            extra = _agent_extra(env, trajectory) if served.agent_mode else {}
            return JSONResponse(completion(request_id, served.model_id, message, finish, tokens, **extra))
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, None))
        return StreamingResponse(
            _stream(served, chat, request_id, env, future, events, (watcher, cancel)), media_type="text/event-stream"
        )

    async def list_models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(served)]})

    async def get_model(request: Request) -> Response:
        if request.path_params["model"] != served.model_id:
            raise APIError(
                404,
                f"the model '{request.path_params['model']}' does not exist; this server serves '{served.model_id}'",
                "model",
                "model_not_found",
            )
        return JSONResponse(_model_card(served))

    async def health(request: Request) -> Response:
        return JSONResponse(
            {
                "status": "ok",
                "model": served.model_id,
                "mode": "agent" if served.agent_mode else "model",
                "in_flight": served.in_flight,
                **served.worker.stats(),
            }
        )

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    handlers = {APIError: _api_error, HTTPException: _http_error, Exception: _server_error}
    return Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]


async def _cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """Set `cancel` when the client hangs up (ASGI's http.disconnect, which comes once the body is
    read), so its episode stops taking a slot and forwards; cancelled when the reply is done."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancel.set()


def _stop_watching(watcher: asyncio.Task, future: Any, cancel: threading.Event) -> None:
    """The reply is done or abandoned: stop watching for the hang-up; an episode still running then has
    no reader (the handler or the stream was cancelled, e.g. Starlette's own disconnect check), so it
    is cancelled too."""
    watcher.cancel()
    if not future.done():
        cancel.set()


async def _stream(
    served: ServedModel,
    chat: Any,
    request_id: str,
    env: Any,
    future: Any,
    events: asyncio.Queue,
    watching: tuple[asyncio.Task, threading.Event],
) -> AsyncIterator[str]:
    """Server-sent events: the role, each tool-calling turn as it runs (agent mode), the reply, the finish."""
    try:
        async for event in _events(served, chat, request_id, env, future, events):
            yield event
    finally:
        _stop_watching(watching[0], future, watching[1])


async def _events(
    served: ServedModel, chat: Any, request_id: str, env: Any, future: Any, events: asyncio.Queue
) -> AsyncIterator[str]:
    model_id = served.model_id
    yield _sse(chunk(request_id, model_id, {"role": "assistant", "content": ""}))
    while (messages := await events.get()) is not None:
        yield _sse(chunk(request_id, model_id, {}, tool_trace=messages))
    try:
        trajectory = future.result()
        message, finish, tokens = reply(trajectory, chat, served.agent_mode)
    except APIError as exc:
        yield _sse(exc.body())
    except Exception as exc:  # noqa: BLE001 - the status line is sent already: report it in the stream
        yield _sse(_internal(exc).body())
    else:
        for delta in stream_deltas(message):
            yield _sse(chunk(request_id, model_id, delta))
        extra = {"episode": _agent_extra(env, trajectory)["episode"]} if served.agent_mode else {}
        yield _sse(chunk(request_id, model_id, {}, finish, **extra))
        if chat.include_usage:
            yield _sse(chunk(request_id, model_id, None, token_usage=tokens))
    yield "data: [DONE]\n\n"


def _agent_extra(env: Any, trajectory: Any) -> dict[str, Any]:
    return {"tool_trace": env.trace, "episode": {"finish_reason": trajectory.finish_reason, "turns": env.turns}}


def _model_card(served: ServedModel) -> dict[str, Any]:
    return {"id": served.model_id, "object": "model", "created": served.created, "owned_by": "agentic-rl"}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _internal(exc: BaseException) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error", code="internal_error")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError), exc
    # 408: the body is still coming (or never will), so the connection cannot carry another request.
    headers = {"retry-after": "1"} if exc.status == 429 else {"connection": "close"} if exc.status == 408 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException), exc
    message = {
        404: f"no route {request.method} {request.url.path}; this server has /v1/chat/completions and /v1/models",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return JSONResponse(
        APIError(exc.status_code, message, code=str(exc.status_code)).body(), status_code=exc.status_code
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    return JSONResponse(_internal(exc).body(), status_code=500)


def serve(cfg: ServeConfig) -> None:
    """Load the model, start the engine worker and serve until interrupted."""
    model, tokenizer, _ = load_for_decoding(cfg.model, cfg.rollout.device)
    engine = build_engine(model, tokenizer, cfg.rollout, seed=cfg.seed, max_concurrent=cfg.max_concurrent)
    worker = EngineWorker(engine, cfg.max_concurrent, cfg.batch_window_ms / 1000)
    agent_tools = [tool.name for tool in cfg.env.make().tools] if cfg.env is not None else None
    app = build_app(ServedModel(cfg.model_id, cfg.rollout, worker, agent_tools, cfg.seed, http=cfg.http))
    mode = (
        f"agent mode: env {cfg.env.name}, tools {', '.join(agent_tools)}"
        if cfg.env is not None and agent_tools
        else "model mode"
    )
    print(f"serving '{cfg.model_id}' ({mode}) on http://{cfg.host}:{cfg.port}/v1", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", **uvicorn_options(cfg.http))
