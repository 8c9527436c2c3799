"""The environment API: an agent episode as a multi-step MDP.

    state s_t   = (prompt, o_1, ..., o_t)          -- the token sequence so far
    action a_t  = one policy turn of text           -- reasoning, tool call(s) or a final answer
    observation = tool results / feedback messages  -- rendered to tokens by the chat format
    reward r_t  = StepResult.reward after each action; return G = sum_t gamma^t r_t

An `Env` instance runs one episode at a time (it is stateful, like a gym env): the rollout
engine asks `make_env` for one instance per concurrent episode.

    env = make_env("arith", difficulty=2)
    task = env.tasks("test", n=1, seed=0)[0]
    messages = env.reset(task)               # [system (with tool schemas), user question]
    result = env.step("<tool_call>...</tool_call>")
    result.observation                       # [{"role": "tool", "name": ..., "content": ...}]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from agentic_rl.config import Config, ConfigError, from_dict
from agentic_rl.plugins import load_entry_points
from agentic_rl.registry import Registry
from agentic_rl.tools.base import Tool


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem. `answer` is the reference final answer as text."""

    id: str
    question: str
    answer: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Env-specific facts: difficulty, number of solution steps, the oracle's solution, ..."""


@dataclasses.dataclass
class StepResult:
    """What `Env.step` returns after one policy turn."""

    observation: list[dict[str, Any]] | None
    """Chat messages to append (role "tool" for tool results, "user" for feedback); None when done."""
    reward: float
    """The per-step reward r_t for this turn."""
    done: bool
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Per-step facts (tool_calls, tool_errors, ...). At done, also the episode summary, whose
    keys `EPISODE_INFO` lists with their meaning and the value every reader assumes when an env
    leaves one out: an env fills what it knows, nothing more is required."""
    context: list[dict[str, Any]] | None = None
    """None (almost every env): the observation is appended to what the policy has seen, so the
    episode is one token sequence. Set (with done=False): the whole conversation the policy sees
    from now on, ending with this step's observation, e.g. [system, task, the last W turns and
    their observations] when older turns drop out of a bounded window. The rollout engine then
    closes the episode's token sequence and starts a new one rendered from `context` like a
    prompt (tool schemas included; a fresh KV cache); `observation` still goes to the episode's
    log. See `Trajectory.previous`."""


EPISODE_INFO: dict[str, tuple[Any, str]] = {
    "correct": (False, "the episode succeeded: a right final answer, or the goal reached (Env.final_answers)"),
    "final_answer": (None, "the text after `Final Answer:`, None when the episode gave none"),
    "reference": (None, "the task's reference answer, for the logs"),
    "format_ok": (False, "the episode ended as the env's format asks (a final answer, where there is one)"),
    "tool_calls": (0, "tool calls made in the whole episode"),
    "tool_errors": (0, "of those, the calls that failed (each got an error observation)"),
    "turns": (0, "policy turns played"),
    "finish": ("", "why it ended: answer, no_answer, max_turns, solved, failed, no_call, error, ..."),
    "score": (
        None,
        "the final answer's grade in [0, 1] (tool envs: 1.0 correct; a bridged verifier may give partial credit)",
    ),
    "reward_terms": (
        {},
        "the named parts of the env's reward, unweighted (a verifiers rubric's functions), whose weighted "
        "sum its step rewards already pay: each is logged as a reward term (Env.reward_terms)",
    ),
}
"""The episode summary in the last `StepResult.info`: key -> (value assumed when absent, meaning).
Evaluation, the oracle runner and the reward terms read these keys through `episode_info`, so an
env that leaves one out is read as its default, never a KeyError. Envs add keys of their own
freely (plan's `rooms_visited`, the self-correction wrapper's `attempts`)."""


def episode_info(info: dict[str, Any]) -> dict[str, Any]:
    """`info` with every `EPISODE_INFO` key it lacks set to that key's default."""
    return {**{key: default for key, (default, _meaning) in EPISODE_INFO.items()}, **info}


class Env:
    """Base class. Subclasses set `name`, `tools`, `max_turns` and implement the methods."""

    name: str = ""
    tools: list[Tool] = []
    max_turns: int = 8
    final_answers: bool = True
    """Episodes end with a final answer that `correct` judges. False where success is a state the
    episode reaches (plan: the goal room): there is nothing to vote on, and evaluation reports no
    maj@k rather than a 0."""
    reward_terms: tuple[str, ...] = ()
    """Names of the parts of its reward the env reports in the last step's `info["reward_terms"]`
    (name -> unweighted value). Training logs each as the reward term `reward/<name>` with weight 0:
    the step rewards already pay their weighted sum, so they are shown, never paid twice."""

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        """The first `n` tasks (all if None) of `split` ("train" or "test"), deterministic in `seed`."""
        raise NotImplementedError

    def reset(self, task: Task) -> list[dict[str, Any]]:
        """Start an episode on `task`; return the initial messages [system, user]."""
        raise NotImplementedError

    def step(self, action_text: str) -> StepResult:
        """Apply one policy turn (its decoded text) and return the observation, reward and done."""
        raise NotImplementedError

    def oracle_actions(self, task: Task) -> list[str]:
        """A scripted policy: the turns that solve `task`, for tests, SFT demos and `envs oracle`.

        The list is fixed before the episode starts (the oracle does not read observations);
        `envs.oracle.play_oracle` replays it through `reset` and `step`.
        """
        raise NotImplementedError(f"env '{self.name}' has no oracle")

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools]


EnvFactory = Callable[..., Env]
_ENVS: Registry[tuple[EnvFactory, type | None]] = Registry(
    "environment", "environments", lambda: _ensure_builtin_envs()
)
"""name -> (the class or factory, its options dataclass or None)."""


def register_env(name: str, options: type | None = None) -> Callable[[EnvFactory], EnvFactory]:
    """Register an Env class (or factory) under `name`, with an optional options dataclass.

    The options dataclass types and documents the keyword arguments `make_env` accepts; unknown
    keys are rejected, never ignored.
    """

    def decorator(factory: EnvFactory) -> EnvFactory:
        _ENVS.add(name, (factory, options), factory)
        return factory

    return decorator


def make_env(name: str, **options: Any) -> Env:
    """A fresh environment `name` built with `options` (checked against its options dataclass)."""
    factory, options_cls = _ENVS.get(name)
    if options_cls is None:
        if options:
            raise ValueError(f"environment '{name}' takes no options, got {sorted(options)}")
        return factory()
    fields = {f.name for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for environment '{name}'; allowed: {sorted(fields)}")

    try:  # each option checked against its type: `tools: none` is no list
        checked = from_dict(options_cls, options, prefix="options.", source=f"environment '{name}'")
    except ConfigError as exc:  # a plain ValueError, so a config embedding this env prefixes its file and key
        raise ValueError(str(exc)) from None
    return factory(checked)


@dataclasses.dataclass
class EnvSpec(Config):
    """An environment as configs name it: `{name: arith, options: {difficulty: 2}}`. GRPO's `env`,
    an evaluation's `env`, SFT's oracle sources and reward-model pairs all embed this one type."""

    name: str = "arith"
    """Registered environment (see `agentic-rl envs list`)."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Its options, checked against its options dataclass (`agentic-rl envs list -v`)."""

    def check(self) -> None:
        """Build one (the validation step, config.check_config): an unknown env or option fails
        before any model loads, not mid-run."""
        self.make()

    def make(self) -> Env:
        """A fresh instance (one per concurrent episode: envs are stateful)."""
        return make_env(self.name, **self.options)


def env_factory(name: str) -> EnvFactory:
    """The class (or factory) registered as `name`."""
    return _ENVS.get(name)[0]


def has_oracle(name: str) -> bool | None:
    """Whether env `name` defines `oracle_actions` (False: it inherits Env's, which raises), known
    from its class without building it; None when it is registered through a factory function."""
    factory = env_factory(name)
    if isinstance(factory, type) and issubclass(factory, Env):
        return factory.oracle_actions is not Env.oracle_actions
    return None


def no_oracle_error(name: str, where: str, instead: str) -> ValueError:
    """The error of a setting that needs env `name`'s oracle when it has none (`has_oracle` False)."""
    return ValueError(
        f"{where}: env '{name}' has no oracle (its class does not define oracle_actions, the turns "
        f"that solve a task), so it cannot give what {where} needs; {instead}, or add oracle_actions "
        "to the env"
    )


def env_options_class(name: str) -> type | None:
    return _ENVS.get(name)[1]


def list_envs() -> list[str]:
    return _ENVS.names()


def _ensure_builtin_envs() -> None:
    """The built-in envs, then those of installed plugin packages (entry points; agentic_rl.plugins)."""
    from agentic_rl.envs import (  # noqa: F401 - imported to register  # local: cycle
        arith,
        gsm8k,
        memory,
        plan,
        reasoning_gym_env,
        self_correction,
        textarena_env,
        verifiers_env,
    )

    load_entry_points("agentic_rl.envs")
