"""`verifiers`: an environment of the verifiers ecosystem (prime-rl's environment packages) as an env.

verifiers (`pip install 'agentic-rl[verifiers]'`, its 0.3 classic stack) environments are modules
whose `load_environment(**env_args)` returns an env holding a dataset (chat prompts with the system
prompt and few-shot turns already in them, answers), a rubric of weighted reward functions and, for
multi-turn envs, an async `env_response`. The bridge plays verifiers' own turn loop
(`MultiTurnEnv.rollout`) one policy turn at a time, with agentic-rl's engine as the model, so the
token ids the policy sampled are the ones trained:

    reset  ──► the dataset row's prompt messages; verifiers' init_state and setup_state
    step   ──► the policy's turn is the assistant message (a ToolEnv's tool calls parsed from its
               <tool_call> blocks); then, as verifiers' loop does: its stop conditions
               (is_completed), else get_prompt_messages, which calls env_response: the new
               messages are the observation (the whole new prompt as `StepResult.context` where
               an env rewrites the history)
    done   ──► verifiers' cleanup renders the completion and the rubric scores it: its weighted
               sum is the last turn's reward (`env_steps` pays it), each function's value is the
               reward term `rubric.<function>` (logged as reward/rubric.<function>/mean); an
               episode is `correct` when the sum reaches the env's own `pass_threshold`

    env: {name: verifiers, options: {env_id: vf_gsm8k, env_args: {num_eval_examples: 100}}}

Departures from verifiers' loop, each so that model output never stops a run: an exception from
`env_response` other than verifiers' own `vf.Error` ends the episode as a `vf.Error` would (recorded
in `info["error"]`, then scored) instead of ending the whole evaluation; a non-finite rubric value
counts 0. `max_turns` caps policy turns; the episode it cuts is scored as it stands. The engine's
own cut (`rollout.max_turns`, token limits) ends an episode unscored (reward 0): keep
rollout.max_turns at least the env's turns.

Splits: train is the env's `dataset`, test its `eval_dataset` (`test_dataset: dataset` reads the
training rows where an env has no eval set: then nothing is held out). Task i of seed 0 is row i;
another seed shuffles the rows. SFT: a row's reference `completion` (the verifiers convention for
SFT data: the conversation after the prompt) is its oracle, replayed through the env, whose rubric
must pass it. What cannot be driven is refused when the env is built (envs/verifiers_load.py).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import random
import re
from typing import Any, Literal

from agentic_rl.config import Config, PositiveInt
from agentic_rl.envs.base import Env, StepResult, Task, register_env
from agentic_rl.envs.library_guard import missing_extra
from agentic_rl.envs.verifiers_load import REFUSED_KINDS, load_verifiers_env, no_client, run_async
from agentic_rl.tools.parse import assistant_turn_text, parse_tool_calls

DEFAULT_MAX_TURNS = 10
"""Policy turns of an env that sets no max_turns of its own (verifiers' -1: unlimited)."""
MODEL = "agentic-rl"
"""The model name verifiers' state records."""


@dataclasses.dataclass
class VerifiersOptions(Config):
    env_id: str = ""
    """The environment's module name, installed or on PYTHONPATH (a verifiers env id also works:
    `vf-gsm8k` is module vf_gsm8k). `agentic-rl envs list` shows the installed environment packages."""
    env_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of its `load_environment`."""
    max_turns: PositiveInt | None = None
    """Cap on policy turns per episode; None: the env's own max_turns (1 for a SingleTurnEnv), or
    10 where it sets none. An episode this cap ends is scored as it stands."""
    test_dataset: Literal["eval_dataset", "dataset"] = "eval_dataset"
    """What the test split (evaluation) reads: the env's eval_dataset, or its training dataset for an
    env without one (then nothing is held out)."""

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ValueError(
                "set env.options.env_id to a verifiers environment module (`agentic-rl envs list` shows "
                "those installed), e.g. {env_id: vf_gsm8k, env_args: {}}"
            )


@register_env("verifiers", VerifiersOptions)
class VerifiersEnv(Env):
    """One verifiers environment: its dataset rows as tasks, its turn loop, its rubric."""

    name = "verifiers"
    final_answers = False  # its rubric grades, not our answer matcher: no maj@k vote

    def __init__(self, options: VerifiersOptions):
        self.options = options
        self.vf_env = load_verifiers_env(self.options.env_id, self.options.env_args)  # refusals, downloads: here
        own = int(getattr(self.vf_env, "max_turns", -1))
        self.max_turns = self.options.max_turns or (own if own > 0 else DEFAULT_MAX_TURNS)
        self.reward_terms = tuple(
            f"rubric.{name}" for name in dict.fromkeys(self.vf_env.rubric._get_reward_func_names())
        )
        self.tools = []
        self.state: Any = None  # verifiers' State of the running episode
        self.prompt: list[Any] = []  # the verifiers messages the policy's next turn answers
        self.task: Task | None = None

    @classmethod
    def catalogue(cls) -> str:
        """The installed verifiers and its environment packages, for `agentic-rl envs list`."""
        try:
            version = importlib.metadata.version("verifiers")
        except importlib.metadata.PackageNotFoundError:
            return missing_extra("verifiers", "verifiers")
        packages = ", ".join(environment_packages()) or "none (pip install one, or name a module on PYTHONPATH)"
        return (
            f"verifiers {version}; environment packages installed: {packages}. Drives SingleTurnEnv, MultiTurnEnv, "
            f"ToolEnv, StatefulToolEnv; refuses judge rubrics, group rewards, {', '.join(REFUSED_KINDS)}"
        )

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The env's tools (a ToolEnv's functions; a row's own `info.tool_defs` in its episode) in the
        chat template's form."""
        defs = self.state["tool_defs"] if self.state is not None else (self.vf_env.tool_defs or [])
        return [
            {"type": "function", "function": {"name": d.name, "description": d.description, "parameters": d.parameters}}
            for d in defs
        ]

    # --- tasks ------------------------------------------------------------------------------

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        rows = self._dataset(split)
        order = list(range(len(rows)))
        if seed:
            random.Random(f"verifiers/{split}/{seed}").shuffle(order)
        return [
            Task(
                f"verifiers/{self.options.env_id}/{split}/{i}",
                _last_user_text(rows[i]["prompt"]),
                str(rows[i].get("answer", "")),
                {"split": split, "row": i},
            )
            for i in order[:n]
        ]

    def _dataset(self, split: str) -> Any:
        if split not in ("train", "test"):
            raise ValueError(
                f"unknown split {split!r}; verifiers envs have 'train' (dataset) and 'test' (eval_dataset)"
            )
        which = "dataset" if split == "train" else self.options.test_dataset
        rows = getattr(self.vf_env, which)
        if rows is None and split == "test":
            raise ValueError(
                f"verifiers environment {self.options.env_id!r} has no eval_dataset; set "
                "env.options.test_dataset=dataset to evaluate on its training rows (then nothing is held out)"
            )
        if rows is None:
            raise ValueError(
                f"verifiers environment {self.options.env_id!r} has no training dataset (an evaluation-only env): "
                "it can be evaluated, not trained on"
            )
        return rows

    # --- episode ----------------------------------------------------------------------------

    def reset(self, task: Task) -> list[dict[str, Any]]:
        self.task, self.turns, self.tool_calls, self.tool_errors, self.done = task, 0, 0, 0, False
        self.state = None
        self.state = run_async(self._start(dict(self._dataset(task.meta["split"])[task.meta["row"]])))
        return _chat(self.prompt)

    async def _start(self, row: dict[str, Any]) -> Any:
        import verifiers as vf  # local: optional extra

        state = await self.vf_env.init_state(row, no_client(), MODEL, None)
        try:
            state = await self.vf_env.setup_state(state) or state
        except vf.Error as exc:
            state["error"] = exc
        self.state = state
        prompt = await self._advance()
        if prompt is None:
            raise RuntimeError(
                f"the verifiers episode ended before its first turn ({state.get('stop_condition')}: {state.get('error')})"
            )
        self.prompt = prompt
        return state

    def step(self, action_text: str) -> StepResult:
        if self.state is None or self.done:
            raise RuntimeError("step() called with no episode running; call reset(task) first")
        self.turns += 1
        return run_async(self._turn(action_text))

    async def _turn(self, text: str) -> StepResult:
        from verifiers.types import Response, ResponseMessage  # local: optional extra

        content, calls = self._split_tool_calls(text)
        message = ResponseMessage(
            content=content,
            tool_calls=calls or None,
            finish_reason="tool_calls" if calls else "stop",
            is_truncated=False,
        )
        await self.vf_env.add_model_response(
            self.state, self.prompt, Response(id=f"turn-{self.turns}", created=0, model=MODEL, message=message)
        )
        before = [*self.prompt, *self.state["trajectory"][-1]["completion"]]
        prompt = await self._advance()
        if prompt is None:
            return await self._finish()
        old, new = _chat(before), _chat(prompt)
        kept = next((k for k, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        self.prompt = prompt
        info = {"turns": self.turns, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors}
        return StepResult(new[kept:], 0.0, False, info, context=new if kept < len(old) else None)

    async def _advance(self) -> list[Any] | None:
        """verifiers' `MultiTurnEnv.rollout` loop up to the next model turn: the prompt messages it
        asks the policy to answer, or None once a stop condition (or `max_turns` here) ends it."""
        import verifiers as vf  # local: optional extra
        from verifiers.utils.message_utils import maybe_normalize_messages  # local: optional extra

        state = self.state
        while not await self.vf_env.is_completed(state):
            if self.turns >= self.max_turns:
                state.stop("agentic_rl_max_turns")
                return None
            try:
                prompt = maybe_normalize_messages(
                    await self.vf_env.get_prompt_messages(state), field_name="prompt_messages"
                )
            except vf.OverlongPromptError:
                state["prompt_too_long"] = state["is_truncated"] = True
                continue
            except Exception as exc:  # noqa: BLE001 - vf.Error as verifiers records it; any other (module docstring) likewise
                state["error"] = exc if isinstance(exc, vf.Error) else vf.Error(f"{type(exc).__name__}: {exc}")
                continue
            if state.get("final_env_response") is None:
                return prompt
        return None

    async def _finish(self) -> StepResult:
        """Render and score the finished episode (verifiers' cleanup, then its rubric)."""
        vf_env, state = self.vf_env, self.state
        self.done = True
        await vf_env.cleanup(state)
        await (
            vf_env.rubric.score_rollout(state) if vf_env.score_rollouts else vf_env.rubric.dummy_score_rollout(state)
        )
        await vf_env.rubric.cleanup(state)
        terms = {f"rubric.{name}": _finite(value) for name, value in (state.get("metrics") or {}).items()}
        reward = _finite(state.get("reward"))
        stop, error = state.get("stop_condition"), state.get("error")
        try:
            answer = vf_env.parser.parse_answer(state["completion"])
        except Exception:  # noqa: BLE001 - a parser that chokes on hostile text: no answer, never a crash
            answer = None
        info = {
            "correct": reward >= vf_env.pass_threshold,
            "score": reward,
            "reward_terms": terms,
            "final_answer": None if answer is None else str(answer),
            "reference": self.task.answer if self.task else None,
            "format_ok": error is None and stop != "agentic_rl_max_turns",
            "finish": "max_turns" if stop == "agentic_rl_max_turns" else str(stop),
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
        }
        if error is not None:
            info["error"] = f"{type(error).__name__}: {error}"
        return StepResult(None, reward, True, info)

    def _split_tool_calls(self, text: str) -> tuple[str, list[Any]]:
        """The turn as an OpenAI-style assistant message (what a served model's tool parser gives a
        verifiers env): its well-formed <tool_call> blocks as tool calls, the rest as content. Only
        where the episode offers tools; elsewhere the whole text is content."""
        from verifiers.types import ToolCall  # local: optional extra

        if not self.state["tool_defs"]:
            return text, []
        parsed = parse_tool_calls(text)
        names = {d.name for d in self.state["tool_defs"]}
        calls = [
            ToolCall(id=f"call_{self.turns}_{i}", name=c.name, arguments=json.dumps(c.arguments))
            for i, c in enumerate(parsed)
            if c.ok
        ]
        self.tool_calls += len(parsed)
        self.tool_errors += sum(1 for c in parsed if not c.ok or c.name not in names)
        for call in parsed:
            if call.ok:
                text = text.replace(call.raw, "", 1)
        return text.strip(), calls

    def oracle_actions(self, task: Task) -> list[str]:
        """The row's reference `completion` (module docstring): its assistant turns, each as the policy
        writes it (content, then its tool calls as <tool_call> blocks)."""
        completion = self._dataset(task.meta["split"])[task.meta["row"]].get("completion")
        if not completion:
            raise NotImplementedError(
                f"task {task.id} has no reference completion (a `completion` column in its row) to "
                "demonstrate; SFT needs rows that carry one"
            )
        if isinstance(completion, str):
            return [completion]
        return [assistant_turn_text(_plain(m)) for m in completion if _plain(m).get("role") == "assistant"]


# ---------------------------------------------------------------------- helpers


def _plain(message: Any) -> dict[str, Any]:
    """A verifiers message (a pydantic model or a dict) as a plain dict without None fields."""
    raw = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    return {key: value for key, value in raw.items() if value is not None}


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content list (images refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        part = _plain(part)
        if part.get("type") != "text":
            raise ValueError(f"a verifiers message holds a {part.get('type')!r} part; the bridge renders text only")
        parts.append(part.get("text", ""))
    return "\n".join(parts)


def _chat(messages: list[Any]) -> list[dict[str, Any]]:
    """Verifiers messages as the chat format renders them: an assistant turn with its tool calls in
    the policy's own form (<tool_call> blocks), a tool result named after the call it answers."""
    out, tool_names = [], {}
    for message in messages:
        plain = _plain(message)
        role = plain.get("role", "user")
        if role == "assistant":
            tool_names.update({call.get("id"): call.get("name") for call in plain.get("tool_calls") or []})
            out.append(
                {"role": "assistant", "content": assistant_turn_text({**plain, "content": _text(plain.get("content"))})}
            )
        elif role == "tool":
            out.append(
                {
                    "role": "tool",
                    "name": tool_names.get(plain.get("tool_call_id"), "tool"),
                    "content": _text(plain.get("content")),
                }
            )
        else:
            out.append({"role": role, "content": _text(plain.get("content"))})
    return out


def _last_user_text(prompt: Any) -> str:
    users = [m for m in prompt if _plain(m).get("role") == "user"] if isinstance(prompt, list) else []
    return _text(_plain(users[-1]).get("content")) if users else str(prompt)


def _finite(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def environment_packages() -> list[str]:
    """Installed distributions that depend on verifiers (its environment packages), as module names."""
    found = set()
    for dist in importlib.metadata.distributions():
        for requirement in dist.requires or []:
            name, _, marker = requirement.partition(";")
            if re.split(r"[\s\[<>=!~(]", name.strip(), maxsplit=1)[0].lower() == "verifiers" and "extra" not in marker:
                found.add((dist.metadata["Name"] or "").replace("-", "_").lower())
    return sorted(found - {"", "verifiers"})
