"""Our environments and reward terms, in the shapes TRL 1.16's `GRPOTrainer` takes.

Usable on their own by TRL users:

    from trl import GRPOConfig, GRPOTrainer
    from agentic_rl.integrations.trl_adapters import (
        make_trl_dataset, make_trl_environment_factory, make_trl_reward_funcs)

    specs = [RewardSpec("accuracy"), RewardSpec("format", weight=0.1)]
    funcs, weights = make_trl_reward_funcs(specs)                       # one TRL reward fn per term
    trainer = GRPOTrainer(
        model="Qwen/Qwen3-0.6B",
        reward_funcs=funcs,
        args=GRPOConfig(reward_weights=weights, max_tool_calling_iterations=5, ...),
        train_dataset=make_trl_dataset("arith", {"difficulty": 2}, n=500),   # prompt + task columns
        environment_factory=make_trl_environment_factory("arith", {"difficulty": 2}),
    )

What TRL's `environment_factory` expects (trl/trainer/grpo_trainer.py, 1.16): a zero-argument callable
returning an instance whose CLASS defines
  * `reset(**row)`: called once per rollout with every column of the dataset row (here `prompt` and
    `task`); it may return a string appended to the last user message, or None (we return None: the
    prompt column already holds the env's [system, user] messages);
  * public methods (no leading underscore, other than `reset` / `get_reward`): each one is a TOOL. TRL
    builds its JSON schema from the signature and Google docstring (`transformers.get_json_schema`),
    renders it with the chat template's `tools=`, parses the model's tool calls with the tokenizer's
    response template, calls `method(**arguments)` and appends `{"role": "tool", "name", "content":
    str(result)}` (an exception becomes `{"error": str(exc)}`), then regenerates. Tool-result tokens get
    tool_mask 0 (no gradient). Up to `max_tool_calling_iterations` rounds.
  * optionally `get_reward()`: a reward owned by the env (we do NOT define it: rewards come from our
    reward terms, through `reward_funcs`, so nothing is counted twice).
Instances are pooled and reused across batches (reset between rollouts), one per rollout. Reward
functions receive the rollout-aligned instances as `environments=` in their kwargs.

The env class is built per env name (`TRLToolEnv`): one method per tool of our env, with the tool
function's own signature and docstring, whose body sends the call through OUR env's `step()` as a
`<tool_call>` block. So the env's own bookkeeping (tool_calls, tool_errors, turn limit, tool error
messages "Error: ...") is what runs. At reward time the final assistant message is stepped into the env
(`_finalize`), which grades it (info: correct, format_ok, final_answer, tool_calls, tool_errors, turns).

Known differences from our engine (documented, not hidden):
  * TRL calls one method per tool call, so a turn with k parallel calls counts k env steps (our
    engine: one step). `info["turns"]` then over-counts such turns; rewards that read `correct`,
    `format_ok`, `tool_calls`, `tool_errors` are unaffected.
  * TRL's schema keeps a "return" entry that our `Tool.schema` drops, so the rendered tool block in the
    prompt differs by that field.
  * Only `ToolEnv` environments (final answer + tools) fit TRL's loop; envs that answer a final turn with
    a "user" feedback message (self_correct) cannot run there and are rejected.

Reward functions (`make_trl_reward_funcs`) are `fn(prompts, completions, **kwargs) -> list[float]`, one
per reward term (so TRL logs each term as `rewards/<name>/mean`, invariant 5), with the term weights as
`reward_weights`. Each builds a real `Trajectory` per completion (messages, env info, policy token count)
and calls our registered term on it; the grading is cached per batch, so k terms grade once.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Sequence

from datasets import Dataset

from agentic_rl.envs.base import Env, StepResult, Task, make_env
from agentic_rl.envs.tool_env import ToolEnv
from agentic_rl.rewards.base import RewardSpec, get_reward
from agentic_rl.rollout.trajectory import Span, Trajectory
from agentic_rl.tools.parse import format_tool_call

TASK_COLUMN = "task"
"""Dataset column holding the task as JSON ({id, question, answer, meta})."""


# ----------------------------------------------------------------------------- tasks and datasets


def task_to_json(task: Task) -> str:
    return json.dumps({"id": task.id, "question": task.question, "answer": task.answer, "meta": task.meta}, default=str)


def task_from_json(text: str) -> Task:
    record = json.loads(text)
    return Task(record["id"], record["question"], record["answer"], record.get("meta", {}))


def make_trl_dataset(
    env_name: str,
    options: dict[str, Any] | None = None,
    n: int = 1000,
    seed: int = 0,
    split: str = "train",
    prompt_fn: Callable[[Env, list[dict[str, Any]]], Any] | None = None,
):
    """A `datasets.Dataset` with `prompt` (the env's reset messages, or `prompt_fn(env, messages)`)
    and `task` (JSON) columns: the first `n` tasks of `split` for `seed`."""
    env = make_env(env_name, **(options or {}))
    rows = {"prompt": [], TASK_COLUMN: []}
    for task in env.tasks(split, n=n, seed=seed):
        messages = env.reset(task)
        rows["prompt"].append(prompt_fn(env, messages) if prompt_fn else messages)
        rows[TASK_COLUMN].append(task_to_json(task))
    return Dataset.from_dict(rows)


# ----------------------------------------------------------------------------- environment factory


class TRLToolEnv:
    """Base of the generated TRL environment classes: one of our envs, driven by TRL's tool loop.

    Public methods of subclasses are the tools (TRL's rule); everything else starts with `_` or is
    `reset` (TRL's reserved name). After the rollout, `_finalize(completion)` steps the final
    assistant text into the env once and returns its info (the leading underscore keeps TRL from
    exposing it as a tool).
    """

    _env_name: str = ""
    _env_options: dict[str, Any] = {}

    def __init__(self) -> None:
        self._env = make_env(self._env_name, **self._env_options)
        if not isinstance(self._env, ToolEnv):
            raise ValueError(
                f"environment '{self._env_name}' ({type(self._env).__name__}) cannot run in TRL's tool loop: TRL ends a "
                "rollout at the first turn without a tool call, so only ToolEnv environments (tools + one final answer) "
                "map onto it; use backend: agentic_rl for this env"
            )
        self._task: Task | None = None
        self._last: StepResult | None = None
        self._final: tuple[StepResult, dict[str, Any]] | None = None

    def reset(self, **row: Any) -> None:
        if TASK_COLUMN not in row:
            raise ValueError(
                f"the dataset row has no '{TASK_COLUMN}' column (got {sorted(row)}); build it with make_trl_dataset"
            )
        self._task = task_from_json(row[TASK_COLUMN])
        self._env.reset(self._task)
        self._last, self._final = None, None
        return None  # the prompt column already holds the env's messages

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if self._last is not None and self._last.done:
            return "Error: the episode is over (turn limit reached); no more tool calls are run"
        result = self._env.step(format_tool_call(name, arguments))
        self._last = result
        if result.observation is None:  # the env ended the episode on this turn (max_turns)
            return "Error: the episode is over (turn limit reached); this call was not run"
        return "\n".join(str(m.get("content", "")) for m in result.observation)

    def _finalize(self, completion: Sequence[dict[str, Any]] | str) -> dict[str, Any]:
        """Grade the episode once: step the final assistant text into the env; returns the env's info."""
        if self._final is not None:
            return self._final[1]
        if self._task is None:
            raise RuntimeError("_finalize() before reset()")
        if self._last is not None and self._last.done:
            result = self._last  # the env already ended the episode (turn limit)
        else:
            text = _final_text(completion)
            result = self._env.step(text if text is not None else "")
            if not result.done:  # an unexecuted tool call in the last turn: the episode had no answer
                result = self._env.step("")
        self._final = (result, dict(result.info))
        return self._final[1]


def _final_text(completion: Sequence[dict[str, Any]] | str) -> str | None:
    """The last assistant message's text, or None if it still asked for tools (TRL stopped early)."""
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    last = completion[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content") or ""
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


def _tool_method(tool) -> Callable:
    name = tool.name

    def method(self, **arguments: Any) -> str:
        return self._call_tool(name, arguments)

    signature = inspect.signature(tool.fn)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = signature.replace(parameters=[self_param, *signature.parameters.values()])
    method.__annotations__ = dict(getattr(tool.fn, "__annotations__", {}))
    method.__doc__ = tool.fn.__doc__
    method.__name__ = method.__qualname__ = name
    return method


def make_trl_environment_factory(env_name: str, options: dict[str, Any] | None = None) -> type[TRLToolEnv]:
    """A class (TRL calls it with no argument) whose instances wrap `make_env(env_name, **options)`.

    Its public methods are exactly the env's tools, with the tool functions' signatures and docstrings.
    Raises ValueError for an unknown env/option, or an env that is not a ToolEnv.
    """
    options = dict(options or {})
    probe = make_env(env_name, **options)  # unknown env or options fail here
    namespace: dict[str, Any] = {"_env_name": env_name, "_env_options": options}
    for tool in probe.tools:
        if not tool.name.isidentifier() or tool.name in ("reset", "get_reward") or tool.name.startswith("_"):
            raise ValueError(f"tool name {tool.name!r} cannot be a TRL environment method")
        namespace[tool.name] = _tool_method(tool)
    cls = type(f"TRL_{env_name}_Env".replace("-", "_"), (TRLToolEnv,), namespace)
    cls()  # fail now, not inside the trainer, if the env does not fit (e.g. not a ToolEnv)
    return cls


# ----------------------------------------------------------------------------- rewards


class _Grader:
    """Turns one TRL batch into our Trajectories, once per batch (shared by all reward functions)."""

    def __init__(
        self,
        env_name: str | None,
        options: dict[str, Any] | None,
        count_tool_tokens: Callable[[list[dict[str, Any]]], int] | None = None,
    ):
        self.env_name, self.options = env_name, dict(options or {})
        self.count_tool_tokens = count_tool_tokens
        """Multi-turn only: tokens of one run of tool messages in the completion ids (TRL's tool_mask 0
        part), so `num_policy_tokens` counts policy tokens only. None: all completion tokens count."""
        self._key: Any = None
        self._trajectories: list[Trajectory] = []

    def __call__(self, prompts, completions, completion_ids=None, environments=None, **kwargs) -> list[Trajectory]:
        if self._key is completions:  # same batch, another reward term: grade once
            return self._trajectories
        trajs = [
            self._one(
                i,
                prompts[i],
                completions[i],
                completion_ids[i] if completion_ids is not None else None,
                environments[i] if environments is not None else None,
                kwargs,
            )
            for i in range(len(completions))
        ]
        self._key, self._trajectories = completions, trajs
        return trajs

    def _one(self, i, prompt, completion, ids, environment, kwargs) -> Trajectory:
        if environment is not None:
            info = environment._finalize(completion)
        else:
            if TASK_COLUMN not in kwargs:
                raise ValueError(
                    f"reward functions need the dataset's '{TASK_COLUMN}' column (got {sorted(kwargs)}); "
                    "build the dataset with make_trl_dataset"
                )
            if self.env_name is None:
                raise ValueError("no environment: pass env_name to make_trl_reward_funcs, or use environment_factory")
            env = make_env(self.env_name, **self.options)
            env.reset(task_from_json(kwargs[TASK_COLUMN][i]))
            text = _final_text(completion)
            result = env.step(text if text is not None else "")
            if not result.done:
                result = env.step("")
            info = dict(result.info)
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        if isinstance(completion, str):
            messages.append({"role": "assistant", "content": completion})
        else:
            messages.extend(dict(m) for m in completion)
        ids = list(ids) if ids is not None else []
        mask = [1] * len(ids)
        policy = len(ids)
        if self.count_tool_tokens is not None and not isinstance(completion, str):
            policy -= sum(self.count_tool_tokens(run) for run in _tool_runs(completion))
            policy = max(policy, 0)
            mask = [1] * policy + [0] * (len(ids) - policy)  # counts only: positions are not token-exact
        turn_rewards = [1.0 if info.get("correct") else 0.0]
        spans = [Span("policy", 0, len(ids))] if ids else []
        return Trajectory(
            input_ids=ids,
            loss_mask=mask,
            logprobs=[0.0] * len(ids),
            spans=spans,
            turn_rewards=turn_rewards,
            env=self.env_name or "",
            task_id="",
            finish_reason=str(info.get("finish", "")),
            messages=messages,
            info=info,
        )


def _tool_runs(completion: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    runs, current = [], []
    for message in completion:
        if message.get("role") == "tool":
            current.append(message)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def make_trl_reward_funcs(
    reward_specs: Sequence[RewardSpec],
    env_name: str | None = None,
    options: dict[str, Any] | None = None,
    count_tool_tokens: Callable[[list[dict[str, Any]]], int] | None = None,
) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """(reward_funcs, reward_weights) for TRL: one function per reward term, named after it.

    Each function has TRL's signature `fn(prompts, completions, **kwargs) -> list[float]` and returns
    the term's UNWEIGHTED value per completion (TRL applies `reward_weights`, logs each function on its
    own). Grading: with `environment_factory`, the rollout's env instance (kwargs["environments"])
    grades its final answer; without (single-turn), a fresh `make_env(env_name, **options)` is reset on
    the row's `task` column and stepped with the completion text.
    """
    if not reward_specs:
        raise ValueError("at least one reward term is needed, e.g. [RewardSpec('accuracy')]")
    grader = _Grader(env_name, options, count_tool_tokens)
    funcs = []
    for spec in reward_specs:
        term = get_reward(spec.name)
        params = dict(spec.params)

        def reward_fn(prompts, completions, _term=term, _params=params, **kwargs) -> list[float]:
            trajs = grader(prompts, completions, **kwargs)
            return [float(v) for v in _term(trajs, **_params)]

        reward_fn.__name__ = reward_fn.__qualname__ = spec.name
        reward_fn.grader = grader  # type: ignore[attr-defined]
        funcs.append(reward_fn)
    return funcs, [float(s.weight) for s in reward_specs]


__all__ = [
    "TASK_COLUMN",
    "TRLToolEnv",
    "make_trl_dataset",
    "make_trl_environment_factory",
    "make_trl_reward_funcs",
    "task_from_json",
    "task_to_json",
]
