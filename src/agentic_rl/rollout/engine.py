"""`RolloutEngine`: run many agent episodes at once and return token-exact `Trajectory`s.

    chat_format = ChatFormat.for_tokenizer(tok)
    backend = RunnerBackend(HFRunner(model, max_slots=32, max_len=2048), chat_format)
    engine = RolloutEngine(backend, chat_format, tok,
                           RolloutConfig(max_turn_tokens=256, max_episode_tokens=2048, max_turns=8),
                           SamplingParams(temperature=1.0, seed=0), tool_workers=4)
    trajectories = engine.run(envs, tasks)        # one env instance per episode: prompts x G
    ...optimizer.step(); engine.sync_weights()     # the backend reads the new weights; version + 1

How one episode flows (P prompt, A policy turn, O observation; mask 1 only on A):

    env.reset ─► P ─► [generate A until </tool_call> | end-of-turn | token limit]
                      ─► env.step(text of A) ─► O rendered by ChatFormat ─► prefill O ─► A ...

All episodes run concurrently with continuous batching: each `Backend.step` is one forward over
the episodes that have something to compute (a prompt or observation prefill, or the last
sampled token), so episodes waiting for a tool or finished cost nothing, and an episode rejoins
decoding in the very step that prefills its observation. The KV cache of an episode lives
across turns: an observation costs only its own tokens.

Limits and `Trajectory.finish_reason` (decided here, tested in tests/test_rollout_engine.py):
  * Every policy turn, however it ended, is passed to `env.step`, so each policy span has a
    turn reward and the env sees every action (a cut turn usually parses as an error/no answer).
  * max_turn_tokens: a turn cut at this limit is still stepped. If the env ends the episode on
    it, the reason is "max_turn_tokens"; otherwise the episode simply continues.
  * max_episode_tokens (prompt + all turns + all observations): a turn is also cut where the
    episode would exceed it; the episode then ends with "max_episode_tokens" whatever the env
    says. An observation that would leave no room for one more generated token ends the episode
    the same way, WITHOUT being appended (so no trailing mask-0 tokens are ever wasted). A prompt
    that leaves no room ends the episode before any generation (prompt span only).
  * max_turns: min(limits.max_turns, env.max_turns) policy turns; then "max_turns".
  * env done after an un-cut turn: "answered" if its info carries a non-None "final_answer",
    else "env_done".
  * env.reset/env.step raising: that episode ends with "error", info["error"] holds the
    message; all other episodes continue.
Precedence, after each turn: error > episode-token cut > env done (cut turn: "max_turn_tokens")
> max_turns > observation overflow > continue.

Per-episode options (`run(..., options=[EpisodeOptions(...), ...])`, used by the server, where
each request brings its own temperature, seed, max_tokens and stop): an episode may sample with
its own `SamplingParams` (and a generator of its own seed: the backend contract), cap its turns
at its own `max_turn_tokens` (the episode limit still applies) and end a turn at `stop_strings`
(the backend's stop "stop_string": the turn is stepped like any un-cut turn). An episode whose
`cancel` event is set (by any thread: the server, when its client went away) ends at the next
step with "cancelled": its slot is released and it costs no further forward.

Episodes whose history is not a prefix: when `env.step` returns a `context` (StepResult.context:
the conversation the policy sees from now on, e.g. a window that dropped old turns), the episode's
current token sequence ends after the policy turn, its backend slot is released, and a new
sequence starts from `chat_format.prompt_ids(context, tools)`, queued like a new episode (it needs
a free slot; the backend forks the longest prefix of it that a running episode's cache holds,
e.g. the system prompt and tool schemas, and prefills the rest). Each sequence is token-exact on its own; the finished
ones go to `Trajectory.previous`. The limits then read per sequence: max_episode_tokens bounds
each sequence (it is the context the backend holds; a context that leaves no room ends the
episode with "max_episode_tokens"), max_turns counts the episode's turns. A sequence's backend
key is episode index + (number of episodes) x (sequence number), so its samples come from their
own generator, a pure function of (seed, episode, sequence).

Determinism (invariant 7): every episode has its own torch.Generator derived from (seed, episode
index), the batch schedule depends only on sampled tokens and env results (tool calls run in
threads but are joined in episode order before the next forward), so the same seed gives the
same trajectories. `run(seed=None)` uses `sampling.seed + run_count`, so successive GRPO steps
draw fresh samples; checkpoint `run_count` to resume exactly.

The engine depends only on `Backend` (rollout/backend.py: the contract every backend passes);
`build_engine` (rollout/factory.py) picks one from `RolloutConfig.backend`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from typing import Any, Sequence

from agentic_rl.envs.base import Env, StepResult, Task
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.backend import Backend, TurnOutput, TurnRequest
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.sampling import SamplingParams
from agentic_rl.rollout.trajectory import Span, Trajectory
from agentic_rl.tools.base import ToolUnavailable


# ---------------------------------------------------------------------- episodes


@dataclasses.dataclass(frozen=True)
class EpisodeOptions:
    """One episode's own settings (see the module docstring); None keeps the engine's."""

    sampling: SamplingParams | None = None
    """Its sampling parameters; its samples then depend on `sampling.seed` alone."""
    max_turn_tokens: int | None = None
    """Its token limit per policy turn, instead of limits.max_turn_tokens."""
    stop_strings: tuple[str, ...] = ()
    """Texts that end a turn as the end-of-turn token does."""
    cancel: threading.Event | None = dataclasses.field(default=None, compare=False)
    """Set it (from any thread) to end the episode at the engine's next step: "cancelled", slot freed."""

    def __post_init__(self) -> None:
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1, got {self.max_turn_tokens}")
        if any(not text for text in self.stop_strings):
            raise ValueError("a stop string must not be empty")


_DEFAULT_OPTIONS = EpisodeOptions()


@dataclasses.dataclass
class _Episode:
    index: int
    env: Env
    task: Task
    max_turns: int
    options: EpisodeOptions = _DEFAULT_OPTIONS
    ids: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    spans: list[Span] = dataclasses.field(default_factory=list)
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    finish_reason: str = ""
    turn_budget_is_episode_room: bool = False
    view: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The conversation the current sequence rendered (== messages until a context change)."""
    previous: list[Trajectory] = dataclasses.field(default_factory=list)
    """Finished token sequences of a non-prefix episode (Trajectory.previous)."""
    key: int = 0
    """The backend key of the current sequence."""

    def append(self, kind: str, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        if not ids:
            return
        start = len(self.ids)
        self.ids.extend(ids)
        self.mask.extend([1 if kind == "policy" else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.spans.append(Span(kind, start, len(self.ids)))  # type: ignore[arg-type]

    @property
    def policy_turns(self) -> int:
        """Turns of the whole episode, every sequence."""
        return sum(1 for span in self.spans if span.kind == "policy") + sum(
            len(seq.policy_spans) for seq in self.previous
        )


class RolloutEngine:
    """Runs episodes concurrently on a `Backend`; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        chat_format: ChatFormat,
        tokenizer: Any,
        limits: RolloutConfig,
        sampling: SamplingParams,
        tool_workers: int = 4,
    ) -> None:
        if limits.max_episode_tokens > backend.max_len:
            raise ValueError(
                f"max_episode_tokens ({limits.max_episode_tokens}) exceeds the backend's max_len ({backend.max_len}); "
                "lower the limit or build the backend with a larger max_len"
            )
        if tool_workers < 1:
            raise ValueError(f"tool_workers must be >= 1, got {tool_workers}")
        self.backend = backend
        self.chat_format = chat_format
        self.tokenizer = tokenizer
        self.limits = limits
        self.sampling = sampling
        self.tool_workers = tool_workers
        self.run_count = 0
        """Completed `run` calls; the default seed of a run is sampling.seed + run_count."""
        self._episodes_in_run = 0
        self.last_stats: dict[str, float] = {}

    @property
    def weights_version(self) -> int:
        """The backend's weights version, stamped on every trajectory (invariant 3)."""
        return self.backend.weights_version

    def sync_weights(self, version: int | None = None) -> int:
        """After an optimizer step (version + 1) or a checkpoint load (`version`: the restored
        one): the backend samples from the model's current weights from now on. Returns the version."""
        return self.backend.sync_weights(version)

    def run(
        self,
        envs: Sequence[Env],
        tasks: Sequence[Task],
        seed: int | None = None,
        options: Sequence[EpisodeOptions] | None = None,
    ) -> list[Trajectory]:
        """One episode per (env, task) pair, all concurrently. Returns trajectories in input order.

        options: one `EpisodeOptions` per episode (None: the engine's settings for all)."""
        if len(envs) != len(tasks):
            raise ValueError(f"run() needs one env per task, got {len(envs)} envs and {len(tasks)} tasks")
        if options is not None and len(options) != len(envs):
            raise ValueError(f"run() needs one EpisodeOptions per episode, got {len(options)} for {len(envs)} episodes")
        if len({id(env) for env in envs}) != len(envs):
            raise ValueError("each episode needs its own Env instance (envs are stateful); got a repeated instance")
        seed = self.sampling.seed + self.run_count if seed is None else seed
        backend = self.backend
        backend.begin(seed, self.sampling)
        version = backend.weights_version
        options = options or [_DEFAULT_OPTIONS] * len(envs)
        self._episodes_in_run = len(envs)
        episodes = [
            self._start(index, env, task, option) for index, (env, task, option) in enumerate(zip(envs, tasks, options))
        ]
        waiting = collections.deque(ep for ep in episodes if not ep.finish_reason)
        generated = 0
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=self.tool_workers) as pool:
                while waiting or backend.has_work():
                    while waiting and backend.capacity() > 0:
                        episode = waiting.popleft()
                        backend.submit(self._request(episode, list(episode.ids)))
                    outputs = backend.step()
                    generated += sum(len(o.token_ids) for o in outputs)
                    if any(option.cancel is not None for option in options):
                        outputs = self._cancel(episodes, outputs, backend, waiting)
                    self._after_turns(
                        [episodes[o.key % len(episodes)] for o in outputs], outputs, backend, pool, waiting
                    )
        finally:
            for episode in episodes:  # frees the backend's slots even if something above raised
                backend.release(episode.key)
        self.run_count += 1
        self.last_stats = {"generated_tokens": generated, "forward_calls": backend.forward_calls}
        return [self._trajectory(ep, version) for ep in episodes]

    # ------------------------------------------------------------------ episode state machine

    def _start(self, index: int, env: Env, task: Task, options: EpisodeOptions) -> _Episode:
        episode = _Episode(
            index, env, task, max_turns=min(self.limits.max_turns, env.max_turns), options=options, key=index
        )
        try:
            episode.messages = [dict(m) for m in env.reset(task)]
        except Exception as exc:  # noqa: BLE001 - a broken env fails its episode, not the batch
            return self._fail(episode, f"env.reset raised {type(exc).__name__}: {exc}")
        episode.view = [dict(m) for m in episode.messages]
        episode.append("prompt", self.chat_format.prompt_ids(episode.view, env.tool_schemas))
        if len(episode.ids) >= self.limits.max_episode_tokens:
            episode.finish_reason = "max_episode_tokens"
        return episode

    def _request(self, episode: _Episode, new_tokens: list[int]) -> TurnRequest:
        """The next turn of `episode` after `new_tokens`, with its own options."""
        options = episode.options
        return TurnRequest(episode.key, new_tokens, self._turn_budget(episode), options.sampling, options.stop_strings)

    def _new_sequence(self, episode: _Episode, context: list[dict[str, Any]], episodes: int) -> bool:
        """Close the episode's token sequence and start one rendered from `context` (module
        docstring). False (the episode is over) when the context leaves no room to generate."""
        done = Trajectory(
            episode.ids,
            episode.mask,
            episode.logprobs,
            episode.spans,
            turn_rewards=episode.turn_rewards[-sum(1 for s in episode.spans if s.kind == "policy") :],
            env=episode.env.name,
            task_id=episode.task.id,
            messages=episode.view,
        )
        done.check()
        episode.previous.append(done)
        episode.ids, episode.mask, episode.logprobs, episode.spans = [], [], [], []
        episode.key += episodes
        episode.view = [dict(m) for m in context]
        try:
            episode.append("prompt", self.chat_format.prompt_ids(episode.view, episode.env.tool_schemas))
        except Exception as exc:  # noqa: BLE001 - e.g. a context message the template rejects
            self._fail(episode, f"rendering the new context failed: {type(exc).__name__}: {exc}")
            return False
        if not episode.ids or len(episode.ids) >= self.limits.max_episode_tokens:
            episode.finish_reason = "max_episode_tokens"
            return False
        return True

    def _turn_budget(self, episode: _Episode) -> int:
        room = self.limits.max_episode_tokens - len(episode.ids)
        turn_limit = episode.options.max_turn_tokens or self.limits.max_turn_tokens
        episode.turn_budget_is_episode_room = room <= turn_limit
        return min(room, turn_limit)

    def _after_turns(
        self,
        episodes: list[_Episode],
        outputs: list[TurnOutput],
        backend: Backend,
        pool,
        waiting: collections.deque | None = None,
    ) -> None:
        """Record finished turns, step their envs (in parallel, joined in order), then continue or
        end each; an episode that starts a new sequence goes back to `waiting` (it needs a slot)."""
        texts = []
        for episode, output in zip(episodes, outputs):
            full_text = self.chat_format.decode_turn(output.token_ids)
            content_ids = output.token_ids[:-1] if output.stop == "stop_token" else output.token_ids
            texts.append((full_text, self.chat_format.decode_turn(content_ids)))
            episode.append("policy", output.token_ids, output.logprobs)
            episode.messages.append({"role": "assistant", "content": texts[-1][1]})
            episode.view.append({"role": "assistant", "content": texts[-1][1]})
        if self.tool_workers > 1 and len(episodes) > 1:
            futures = [pool.submit(_safe_step, ep.env, content) for ep, (_, content) in zip(episodes, texts)]
            results = [future.result() for future in futures]  # joined in episode order: deterministic
        else:
            results = [_safe_step(ep.env, content) for ep, (_, content) in zip(episodes, texts)]
        for episode, output, (full_text, _), result in zip(episodes, outputs, texts, results):
            key = episode.key
            request = self._continue_or_finish(episode, output, full_text, result)
            if request is None:
                backend.release(key)
                if episode.key != key and not episode.finish_reason:  # a new sequence: queued like a new episode
                    assert waiting is not None, "a context change needs the run's waiting queue"
                    waiting.append(episode)
            else:
                backend.submit(request)

    def _continue_or_finish(
        self, episode: _Episode, output: TurnOutput, full_text: str, result: StepResult | str
    ) -> TurnRequest | None:
        """Apply the limit rules of the module docstring. Returns the next turn's request, or None if finished."""
        if isinstance(result, str):
            episode.turn_rewards.append(0.0)  # keep one reward per policy span
            self._fail(episode, result)
            return None
        episode.turn_rewards.append(float(result.reward))
        episode.info = dict(result.info)
        cut = None
        if output.stop == "length":
            cut = "max_episode_tokens" if episode.turn_budget_is_episode_room else "max_turn_tokens"
        if cut == "max_episode_tokens":
            episode.finish_reason = cut
        elif result.done:
            answered = result.info.get("final_answer") is not None
            episode.finish_reason = cut or ("answered" if answered else "env_done")
        elif episode.policy_turns >= episode.max_turns:
            episode.finish_reason = "max_turns"
        elif not result.observation:
            self._fail(episode, "env.step returned done=False without an observation")
        if episode.finish_reason:
            return None
        if result.context is not None:  # the history is not a prefix: a new token sequence
            episode.messages.extend(dict(m) for m in result.observation)  # type: ignore[union-attr]
            self._new_sequence(episode, result.context, self._episodes_in_run)
            return None
        try:
            observation_ids = self.chat_format.observation_ids(
                episode.view[:-1], full_text, result.observation, episode.env.tool_schemas
            )
        except Exception as exc:  # noqa: BLE001 - e.g. an observation message the template rejects
            self._fail(episode, f"rendering the observation failed: {type(exc).__name__}: {exc}")
            return None
        if len(episode.ids) + len(observation_ids) >= self.limits.max_episode_tokens:
            episode.finish_reason = "max_episode_tokens"  # the observation is NOT appended
            return None
        episode.append("observation", observation_ids)
        episode.messages.extend(dict(m) for m in result.observation)
        episode.view.extend(dict(m) for m in result.observation)
        return self._request(episode, observation_ids)

    def _cancel(
        self, episodes: list[_Episode], outputs: list[TurnOutput], backend: Backend, waiting: collections.deque
    ) -> list[TurnOutput]:
        """End every unfinished episode whose cancel event is set ("cancelled", its slot released, out
        of `waiting`); the outputs of the others."""
        cancelled = {
            ep.index
            for ep in episodes
            if not ep.finish_reason and ep.options.cancel is not None and ep.options.cancel.is_set()
        }
        for index in cancelled:
            episodes[index].finish_reason = "cancelled"
            backend.release(episodes[index].key)
        if cancelled:
            kept = [episode for episode in waiting if episode.index not in cancelled]
            waiting.clear()
            waiting.extend(kept)
        return [output for output in outputs if output.key % len(episodes) not in cancelled]

    def _fail(self, episode: _Episode, message: str) -> _Episode:
        episode.finish_reason = "error"
        episode.info = {**episode.info, "error": message}
        return episode

    def _trajectory(self, episode: _Episode, version: int) -> Trajectory:
        for seq in episode.previous:
            seq.weights_version, seq.finish_reason = version, "context"
        trajectory = Trajectory(
            input_ids=episode.ids,
            loss_mask=episode.mask,
            logprobs=episode.logprobs,
            spans=episode.spans,
            turn_rewards=episode.turn_rewards,
            weights_version=version,
            env=episode.env.name,
            task_id=episode.task.id,
            finish_reason=episode.finish_reason,
            messages=episode.messages,
            info=episode.info,
            previous=episode.previous,
        )
        trajectory.check()
        return trajectory


def _safe_step(env: Env, text: str) -> StepResult | str:
    """env.step, with an exception turned into its message (the episode fails, the batch goes on)."""
    try:
        return env.step(text)
    except ToolUnavailable:
        raise  # the host cannot run a tool (e.g. no sandbox): stop the run, never train on it
    except Exception as exc:  # noqa: BLE001
        return f"env.step raised {type(exc).__name__}: {exc}"
