"""Reward terms: small named functions of a finished episode, composed with weights.

Each term is a function `term(trajectories, **params) -> list[float]` registered by name,
so configs can name it:

    rewards:
      - {name: accuracy, weight: 1.0}
      - {name: step_bonus, weight: 1.0, params: {beta: 0.05, cap: 5}}

The composer sets `trajectory.reward` (the weighted sum) and `trajectory.reward_components`
(each term's unweighted value), and every component is logged on its own (invariant 5).
Terms see the episode through `Trajectory.info` (what the environment graded: correct,
format_ok, tool_calls, tool_errors, ...), its policy tokens, turn rewards and messages.

The environment's own per-step rewards r_t (`StepResult.reward`) enter the return through the
`env_steps` term, Σ_t γ^t r_t, the default reward of GRPO and PPO. A tool env's step rewards are
its success payout (1.0 on the last turn of a correct episode) plus whatever its tools add
(a cost per move, `tool_success_reward`), so `env_steps` alone is the env's whole return. A list
without `env_steps` leaves the step rewards out; that is allowed only while they are nothing but
the success payout, which `accuracy` pays as well: an episode with any other step reward stops
the run, naming the env and the reward, unless the list says `{name: env_steps, weight: 0}`
(left out on purpose). A step reward never drops out silently.

An env whose reward has named parts of its own (a verifiers rubric's functions: `Env.reward_terms`)
reports their values in the episode's `info["reward_terms"]`; `reported_terms` turns them into
terms of weight 0, so each is logged as `reward/<name>` beside the others while `env_steps` pays
their weighted sum, once.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any, Callable, Sequence

from agentic_rl.config import Config
from agentic_rl.plugins import load_entry_points
from agentic_rl.registry import Registry
from agentic_rl.rollout.trajectory import Trajectory

RewardFn = Callable[..., list[float]]
_REWARDS: Registry[RewardFn] = Registry("reward", "rewards", lambda: _ensure_builtin_rewards())
"""name -> the term, lifted to a batch (trajectories, **params) -> one float each."""


def register_reward(name: str, per_episode: bool = True) -> Callable[[Callable], Callable]:
    """Register a reward term under `name`.

    With `per_episode=True` (the usual case) the function takes one Trajectory and returns a
    float; the registry lifts it to a batch. With `per_episode=False` it takes the whole list
    (for terms that batch, such as a reward model).
    """

    def decorator(fn: Callable) -> Callable:
        if per_episode:

            def batched(trajectories: Sequence[Trajectory], **params: Any) -> list[float]:
                return [float(fn(t, **params)) for t in trajectories]

            batched.__wrapped__ = fn  # type: ignore[attr-defined]
            batched.__doc__ = fn.__doc__
            _REWARDS.add(name, batched, fn)
        else:
            _REWARDS.add(name, fn, fn)
        return fn

    return decorator


def get_reward(name: str) -> RewardFn:
    return _REWARDS.get(name)


def list_rewards() -> list[str]:
    return _REWARDS.names()


def reward_parameters(name: str) -> list[str]:
    """The keyword parameters reward `name` accepts (for config validation)."""
    fn = get_reward(name)
    target = getattr(fn, "__wrapped__", fn)
    params = list(inspect.signature(target).parameters.values())[1:]
    return [
        p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY or p.default is not inspect.Parameter.empty
    ]


@dataclasses.dataclass
class RewardSpec(Config):
    """One weighted reward term in a config."""

    name: str
    """Registered reward name (see `agentic-rl rewards list`)."""
    weight: float = 1.0
    """Multiplier of this term in the total reward."""
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword parameters of the term (e.g. beta, cap for step_bonus)."""

    def check(self) -> None:
        """The name and parameters against the registry (the validation step, config.check_config)."""
        get_reward(self.name)  # raises with the list of known names
        allowed = reward_parameters(self.name)
        unknown = sorted(set(self.params) - set(allowed))
        if unknown:
            raise ValueError(f"reward '{self.name}' has no parameter(s) {unknown}; allowed: {allowed}")
        types_of = reward_parameter_types(self.name)
        for key, value in self.params.items():
            wanted = types_of.get(key)
            if wanted is not None and not _is_a(value, wanted):
                names = " or ".join(_TYPE_NAMES[kind] for kind in wanted)
                raise ValueError(
                    f"reward '{self.name}': params.{key} must be {names}, got {value!r}; "
                    f"`agentic-rl rewards list` shows each term's parameters"
                )


_TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", type(None): "null"}


def reward_parameter_types(name: str) -> dict[str, tuple[type, ...]]:
    """{parameter: the plain types its annotation allows} for each keyword parameter of reward `name`
    annotated with bool, int, float, str or a union of them (None included); others are not checked."""
    fn = get_reward(name)
    target = getattr(fn, "__wrapped__", fn)
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: nothing to check against
        return {}
    out = {}
    for key in reward_parameters(name):
        hint = hints.get(key)
        kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if kinds and all(kind in _TYPE_NAMES for kind in kinds):
            out[key] = tuple(kinds)
    return out


def _is_a(value: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a config value fits one of `kinds` (an int fits float; a bool fits only bool)."""
    if isinstance(value, bool):
        return bool in kinds
    return any(isinstance(value, kind) or (kind is float and isinstance(value, int)) for kind in kinds)


class RewardComposer:
    """Weighted sum of reward terms; records every component on each trajectory."""

    def __init__(self, specs: Sequence[RewardSpec], extra_terms: dict[str, tuple[RewardFn, float]] | None = None):
        if not specs and not extra_terms:
            raise ValueError("at least one reward term is needed, e.g. rewards: [{name: accuracy}]")
        clashes = sorted({spec.name for spec in specs} & set(extra_terms or {}))
        if clashes:
            raise ValueError(
                f"reward term(s) {clashes} are both in the reward list and reported by the env or the reward "
                "model; rename the registered term"
            )
        self.specs = list(specs)
        self.extra_terms = dict(extra_terms or {})

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[float]:
        """Score `trajectories` in place (reward, reward_components) and return the totals."""
        if not any(spec.name == "env_steps" for spec in self.specs):
            for traj in trajectories:
                refuse_unpaid_step_rewards(traj)
        totals = [0.0] * len(trajectories)
        terms = [(s.name, get_reward(s.name), s.weight, s.params) for s in self.specs]
        terms += [(name, fn, weight, {}) for name, (fn, weight) in self.extra_terms.items()]
        for name, fn, weight, params in terms:
            values = fn(list(trajectories), **params)
            assert len(values) == len(trajectories), f"reward '{name}' returned {len(values)} values"
            for i, (traj, value) in enumerate(zip(trajectories, values)):
                traj.reward_components[name] = float(value)
                totals[i] += weight * float(value)
        for traj, total in zip(trajectories, totals):
            traj.reward = total
        return totals


def reported_terms(names: Sequence[str]) -> dict[str, tuple[RewardFn, float]]:
    """Extra terms of weight 0 (module docstring) for the env's reward parts `names`: each reads its
    value from an episode's `info["reward_terms"]`, 0.0 where an episode reports none (another env's
    task in a mix, an episode that failed)."""

    def term(name: str) -> RewardFn:
        def values(trajectories: Sequence[Trajectory], **params: Any) -> list[float]:
            return [float((traj.info.get("reward_terms") or {}).get(name, 0.0)) for traj in trajectories]

        return values

    return {name: (term(name), 0.0) for name in names}


def refuse_unpaid_step_rewards(traj: Trajectory) -> None:
    """Raise when `traj`'s step rewards hold more than the success payout (module docstring): a
    reward list without `env_steps` would leave them out of the return."""
    payout = [0.0] * len(traj.turn_rewards)
    if payout:
        payout[-1] = 1.0 if traj.info.get("correct") else 0.0
    if traj.turn_rewards == payout or (traj.finish_reason == "error" and not any(traj.turn_rewards)):
        return
    raise ValueError(
        f"environment '{traj.env}' paid step rewards {[round(r, 6) for r in traj.turn_rewards]} on task "
        f"{traj.task_id!r}, beyond its success payout, and the reward list has no env_steps term, so they would "
        f"count for nothing. Add `{{name: env_steps}}` to `rewards` (the env's return Σ γ^t r_t, success payout "
        f"included: drop `accuracy` beside it unless you mean to pay success twice), or `{{name: env_steps, "
        f"weight: 0}}` to leave them out on purpose"
    )


def _ensure_builtin_rewards() -> None:
    """The built-in rewards, then those of installed plugin packages (entry points; agentic_rl.plugins)."""
    from agentic_rl.rewards import terms  # noqa: F401  # local: cycle

    load_entry_points("agentic_rl.rewards")
