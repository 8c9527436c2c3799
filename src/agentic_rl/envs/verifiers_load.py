"""Loading a verifiers environment for the `verifiers` bridge (envs/verifiers_env.py): by module name
and `load_environment` arguments, once per process, offline, and refused by name where the bridge
cannot drive it; and the one asyncio loop on which its coroutines run.

What is refused, before any model loads (the bridge plays verifiers' own turn loop itself, our
engine being the model; see verifiers_env.py):

    not a MultiTurnEnv, or rollout /         its rollout is its own: it would call the model through
      get_model_response overridden          its own OpenAI client (CliAgentEnv, EnvGroup, ...)
    a kind in REFUSED_KINDS                  its tools or agent run in a service (sandbox, MCP, browser)
    a JudgeRubric in its rubric              a judge model scores it through an OpenAI client
    a group reward function                  it scores a group of rollouts together; an episode here
                                             is scored alone
    message_type "completion"                a raw-text prompt; the bridge renders chat turns

An env that asks a model itself from inside `env_response` cannot be seen from outside: its state's
client is `NoClient`, whose every call raises, so such an episode ends with the error (never the run).

`load_environment` also does things a library may do at import: verifiers' `Environment` installs
SIGINT and SIGTERM handlers (teardown, then exit 143) over the process's own. The bridge keeps the
process's handlers: checkpointing on a signal is the trainer's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import threading
from typing import Any, Coroutine, Iterator, TypeVar

import datasets

from agentic_rl.envs.library_guard import missing_extra, offline

REFUSED_KINDS: dict[str, str] = {
    "CliAgentEnv": "runs an agent program that calls the model through an OpenAI-compatible endpoint of its own",
    "SandboxMixin": "runs its agent or tools in Prime's remote sandboxes, a network service",
    "SandboxEnv": "runs its tools in Prime's remote sandboxes, a network service",
    "MCPEnv": "its tools are MCP servers it starts and connects to",
    "BrowserEnv": "drives a remote browser service",
    "OpenEnvEnv": "runs its environment as a server in a container",
    "EnvGroup": "routes each task to one of its member envs; bridge one member (its own env_id) at a time",
}
"""verifiers env classes (matched anywhere in an env's class hierarchy) the bridge refuses, and why."""

_LOADED: dict[tuple[str, str], Any] = {}
_LOAD_LOCK = threading.Lock()
T = TypeVar("T")


def load_verifiers_env(env_id: str, env_args: dict[str, Any]) -> Any:
    """The verifiers environment `env_id` built with `env_args`, its datasets built: loaded once per
    process (every episode's Env shares it; verifiers keeps an episode's state in its `State`).
    ValueError naming what is missing, what failed, or the kind refused and why."""
    key = (env_id, json.dumps(env_args, sort_keys=True, default=repr))
    with _LOAD_LOCK:
        if key not in _LOADED:
            _LOADED[key] = _load(env_id, env_args)
        return _LOADED[key]


def _load(env_id: str, env_args: dict[str, Any]) -> Any:
    try:
        import verifiers as vf  # local: optional extra
    except ImportError as exc:
        raise ValueError(missing_extra("verifiers", "verifiers")) from exc
    if not hasattr(vf, "MultiTurnEnv"):
        raise ValueError(
            f"the verifiers bridge drives verifiers 0.3's classic environments (load_environment, MultiTurnEnv, "
            f"Rubric); the installed verifiers {getattr(vf, '__version__', '?')} has none: "
            "pip install 'agentic-rl[verifiers]'"
        )
    what = f"verifiers environment {env_id!r} (env_args {env_args})"
    bars_were_on = not datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()
    try:
        with offline(what), _process_signals_kept():
            env = vf.load_environment(env_id, **env_args)
            refusal = refusal_reason(env)
            if refusal is None:
                env.build_dataset()  # a lazy dataset builder runs here, offline, not mid-run
                env.build_eval_dataset()
    except Exception as exc:  # noqa: BLE001 - an env module raises what it raises; each named below
        raise ValueError(_load_failure(what, exc)) from exc
    finally:
        if bars_were_on:
            datasets.utils.enable_progress_bars()
    if refusal is not None:
        raise ValueError(
            f"{what} is refused: {refusal}. The bridge drives verifiers' turn loop itself with our engine "
            "as the model (SingleTurnEnv, MultiTurnEnv, ToolEnv, StatefulToolEnv and their kin)"
        )
    return env


def refusal_reason(env: Any) -> str | None:
    """Why the bridge cannot drive `env` (module docstring), or None."""
    import verifiers as vf  # local: optional extra

    kinds = [cls.__name__ for cls in type(env).__mro__]
    for kind, why in REFUSED_KINDS.items():
        if kind in kinds:
            return f"{type(env).__name__} is of kind {kind}, which {why}"
    if not isinstance(env, vf.MultiTurnEnv):
        return (
            f"{type(env).__name__} is no MultiTurnEnv: its rollout is its own, calling the model through its own client"
        )
    for method in ("rollout", "get_model_response"):
        if getattr(type(env), method) is not getattr(vf.MultiTurnEnv, method):
            return f"{type(env).__name__} overrides {method}, so it calls the model through its own client"
    if getattr(env, "message_type", "chat") != "chat":
        return f"its message_type is {env.message_type!r}: a raw-text prompt, and the bridge renders chat turns"
    rubrics = _rubrics(env.rubric)
    judged = [type(r).__name__ for r in rubrics if "JudgeRubric" in [cls.__name__ for cls in type(r).__mro__]]
    if judged:
        return f"its rubric holds a {judged[0]}, which asks a judge model through an OpenAI client"
    grouped = [getattr(f, "__name__", repr(f)) for r in rubrics for f in r.funcs if r._is_group_func(f)]
    if grouped:
        return f"rubric function(s) {grouped} score a group of rollouts together, and an episode here is scored alone"
    return None


def _rubrics(rubric: Any) -> list[Any]:
    """`rubric` and, for a RubricGroup, every rubric inside it."""
    return [rubric] + [inner for member in getattr(rubric, "rubrics", []) for inner in _rubrics(member)]


def _load_failure(what: str, exc: BaseException) -> str:
    """The message for a failed load: a download it attempted (named), a module that is not there,
    or the env's own error."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    download = next((e for e in chain if isinstance(e, ConnectionError)), None)
    if download is not None:
        return (
            f"{what} needs data it would download at run time, which agentic-rl never does: {download}. "
            "Put that data in the local Hugging Face cache first, or pick another environment"
        )
    missing = next((e for e in chain if isinstance(e, ImportError)), None)
    if missing is not None:
        return (
            f"cannot import {what}: {type(missing).__name__}: {missing}. Install its package, or put the folder "
            "holding its module on PYTHONPATH (`agentic-rl envs list` shows the installed environment packages)"
        )
    root = chain[-1]
    return f"{what} failed to load: {type(root).__name__}: {root}"


@contextlib.contextmanager
def _process_signals_kept() -> Iterator[None]:
    """Run the block with `signal.signal` a no-op, so a library cannot replace the process's handlers
    (module docstring); it also lets a load run off the main thread, where installing one would raise."""
    original = signal.signal
    signal.signal = lambda signum, handler: signal.getsignal(signum)  # type: ignore[assignment]
    try:
        yield
    finally:
        signal.signal = original


# ---------------------------------------------------------------------- the owned event loop

_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOOP_LOCK = threading.Lock()


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to the end on the bridge's own event loop and return its result (or raise).

    The loop runs on a daemon thread of its own, one per process (a new one after a fork), so the
    callers, whichever thread they are on and whether or not a loop runs there (the server's, the
    engine's tool workers), block only on their own coroutine, and every verifiers env of the
    process lives on one loop (an asyncio lock an env holds is bound to the loop that made it)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="verifiers-bridge-loop", daemon=True).start()
            _LOOP = (os.getpid(), loop)
        loop = _LOOP[1]
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()


@functools.lru_cache(maxsize=1)
def no_client() -> Any:
    """A verifiers `Client` whose every call raises: the state of an episode needs one, and the
    bridge's episodes never ask a model through it (module docstring)."""
    from verifiers.clients import Client  # local: optional extra

    class NoClient(Client):
        def _refuse(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                "this verifiers env asked a model through its own client; the bridge's policy is "
                "agentic-rl's engine, and it answers only the env's turns"
            )

        setup_client = _refuse

        async def to_native_tool(self, *args: Any, **kwargs: Any) -> Any:
            self._refuse()

        async def to_native_prompt(self, *args: Any, **kwargs: Any) -> Any:
            self._refuse()

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            self._refuse()

        async def raise_from_native_response(self, *args: Any, **kwargs: Any) -> None:
            self._refuse()

        async def from_native_response(self, *args: Any, **kwargs: Any) -> Any:
            self._refuse()

        async def close(self) -> None:
            return None

    return NoClient(None)
