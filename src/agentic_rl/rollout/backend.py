"""The backend seam: what the rollout engine needs from whatever generates tokens.

The engine (rollout/engine.py) runs episodes; a backend generates their turns. The seam is "extend
this episode's context by these tokens, then generate one turn", not a per-token forward, because
a generation server (vLLM, llama.cpp, a remote endpoint) owns its batching, cache and sampling, and
per-token round trips to it would be hopeless.

    backend.begin(seed, sampling)                                   # a run: seeds, temperature
    backend.submit(TurnRequest(key=0, new_tokens=prompt_ids, max_new_tokens=128))
    while backend.has_work():
        for turn in backend.step():                                 # TurnOutputs, maybe none
            ...env.step(decode(turn.token_ids)) -> observation ids
            backend.submit(TurnRequest(turn.key, observation_ids, 128))   # or backend.release(turn.key)
    ...optimizer.step(); backend.sync_weights()                     # version + 1

The contract (tests/test_backend_contract.py runs it over every backend present):
  * Token in, token out. `submit` takes token ids, never text; a continuing episode's context
    is everything submitted for its key so far plus the turns it generated (so an observation
    costs only its own tokens). `TurnOutput.token_ids` are the sampled ids, the stop token
    included; nothing is decoded and re-encoded.
  * Raw sampling log-probs. `TurnOutput.logprobs[i]` is log_softmax(logits / T) of
    token_ids[i] under the weights that sampled it, before top-p/top-k filtering (the convention
    of rollout/sampling.py; with greedy decoding, T = 1). Trainers use them as π_old.
  * Finish reasons. `stop` is "stop_token" (end-of-turn or eos: the last id is a stop id),
    "tool_call" (the turn ends with `</tool_call>`, as ChatFormat.ends_turn decides),
    "stop_string" (the turn's text now contains one of the request's `stop_strings`) or "length"
    (max_new_tokens generated). A turn never runs past its first stop.
  * Determinism. Episode `key`'s samples depend only on (seed, key) and its context, not on the
    other episodes or the batch schedule: the same run gives the same turns.
  * Per-episode sampling. An episode whose first `TurnRequest` carries its own `sampling`
    samples with those parameters and a generator of `sampling.seed` alone (not the run's seed or
    its key), whatever the other episodes of the batch use: a served request with a seed is
    reproducible whichever requests share its batch.
  * Weights. `weights_version` names the weights turns are sampled from; `sync_weights()` makes
    later turns use the model's current parameters and returns the new version (or sets a
    restored checkpoint's). The engine
    stamps the version of the run's start on every trajectory.
  * Capacity. `capacity()` is how many new episodes may be submitted now (continuing episodes
    never need capacity); `release(key)` frees an episode's context; `max_len` bounds a context.

Backends here: `RunnerBackend` over a per-token `Runner` (rollout/runner.py: HFRunner, the
transformers reference; FastRunner, our decode path), chosen by `RolloutConfig.backend`.
A vLLM backend would send `prompt_token_ids` with SamplingParams(max_tokens=budget,
stop_token_ids=..., stop=["</tool_call>"], include_stop_str_in_output=True, logprobs=0, seed=...)
and ask for raw (unprocessed) log-probs; its prefix caching makes the repeated prompt nearly free.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from agentic_rl.models.backbone import MIN_SHARED_PREFIX
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.runner import Runner
from agentic_rl.rollout.sampling import SamplingParams, make_generator, sample


@dataclasses.dataclass
class TurnRequest:
    """Extend episode `key`'s context by `new_tokens`, then generate one turn of at most `max_new_tokens`."""

    key: int
    new_tokens: list[int]
    max_new_tokens: int
    sampling: SamplingParams | None = None
    """This episode's own sampling instead of the run's (read at its first submit; see the contract)."""
    stop_strings: tuple[str, ...] = ()
    """Texts that also end this turn (stop "stop_string"), e.g. an API request's `stop`."""


@dataclasses.dataclass
class TurnOutput:
    """One generated turn: its tokens (stop token included), their sampling log-probs, and why it stopped."""

    key: int
    token_ids: list[int]
    logprobs: list[float]
    stop: str
    """"stop_token" (end-of-turn/eos), "tool_call" (</tool_call> completed), "stop_string" (a
    request's stop text appeared) or "length" (budget hit)."""


class Backend(Protocol):
    """What the engine needs from a generator (the contract is in the module docstring)."""

    max_len: int
    """Most tokens one episode's context may hold."""
    weights_version: int
    """The version of the weights turns are sampled from."""
    forward_calls: int
    """Model calls so far (a statistic; 0 where the backend cannot tell)."""

    def begin(self, seed: int, sampling: SamplingParams) -> None:
        """Start a run: episode `key` samples with a generator derived from (seed, key)."""

    def capacity(self) -> int:
        """How many more episodes can be submitted for the first time now."""

    def submit(self, request: TurnRequest) -> None:
        """Queue new context tokens and a turn to generate for an episode (new or continuing)."""

    def step(self) -> list[TurnOutput]:
        """Advance generation; return the turns that finished (maybe none)."""

    def has_work(self) -> bool:
        """True while some submitted turn has not come back."""

    def release(self, key: int) -> None:
        """The episode is over; free its context."""

    def sync_weights(self, version: int | None = None) -> int:
        """Sample later turns from the model's current parameters; the version becomes `version`
        (a restored checkpoint's) or the next one. Returns it."""


@dataclasses.dataclass
class _RowState:
    slot: int
    generator: torch.Generator
    sampling: SamplingParams
    stop_strings: tuple[str, ...] = ()
    pending: list[int] | None = None  # tokens to append at the next forward
    last_token: int | None = None  # last token of a finished turn: not yet in the cache
    max_new_tokens: int = 0
    turn_ids: list[int] = dataclasses.field(default_factory=list)
    turn_logprobs: list[float] = dataclasses.field(default_factory=list)
    cached: list[int] = dataclasses.field(default_factory=list)  # the tokens the slot's cache holds, in order


class RunnerBackend:
    """`Backend` over a per-token `Runner` (HFRunner, FastRunner) and `sample`: one forward and
    one sample per step, for every episode with something to compute.

    The last token of a finished turn is fed to the model together with the next observation
    (one prefill chunk), so a turn that ends the episode never costs an extra forward.
    """

    def __init__(self, runner: Runner, chat_format: ChatFormat) -> None:
        self.runner = runner
        self.chat_format = chat_format
        self.max_len = runner.max_len
        self.sampling = SamplingParams()
        self.seed = 0
        self.weights_version = 0
        self.forward_calls = 0
        self._rows: dict[int, _RowState] = {}
        self.min_shared_prefix = MIN_SHARED_PREFIX
        """Shortest common prompt prefix worth a separate prefill or a fork (see `_share_prompt_prefix`);
        the same threshold as the training forward's shared prefix (models/backbone.py)."""
        self.prefix_forks = 0
        """New episodes that forked their prompt's prefix from a running one's cache (a statistic)."""

    def begin(self, seed: int, sampling: SamplingParams) -> None:
        if self._rows:
            raise RuntimeError(f"begin() with {len(self._rows)} episode(s) of the last run not released")
        self.seed, self.sampling = seed, sampling

    def sync_weights(self, version: int | None = None) -> int:
        if self._rows:
            raise RuntimeError("sync_weights() during a run: the episodes in flight would mix two weight versions")
        self.runner.sync_weights()
        self.weights_version = self.weights_version + 1 if version is None else version
        return self.weights_version

    def capacity(self) -> int:
        return self.runner.max_slots - len(self._rows)

    def submit(self, request: TurnRequest) -> None:
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        row = self._rows.get(request.key)
        if row is None:
            own = request.sampling
            generator = make_generator(own.seed, 0) if own is not None else make_generator(self.seed, request.key)
            row = _RowState(self.runner.alloc(), generator, own or self.sampling)
            self._rows[request.key] = row
        row.stop_strings = tuple(request.stop_strings)
        assert row.pending is None and not row.turn_ids, f"episode {request.key} already has a turn in flight"
        chunk = ([row.last_token] if row.last_token is not None else []) + list(request.new_tokens)
        assert chunk, f"episode {request.key}: nothing to feed the model"
        row.pending, row.last_token, row.max_new_tokens = chunk, None, request.max_new_tokens

    def has_work(self) -> bool:
        return any(row.pending is not None for row in self._rows.values())

    def release(self, key: int) -> None:
        row = self._rows.pop(key, None)
        if row is not None:
            self.runner.free(row.slot)

    def step(self) -> list[TurnOutput]:
        keys = sorted(key for key, row in self._rows.items() if row.pending is not None)
        if not keys:
            return []
        rows = [self._rows[key] for key in keys]
        self._share_prompt_prefix(rows)
        logits = self.runner.forward([row.slot for row in rows], [row.pending for row in rows])  # (B, V)
        self.forward_calls += 1
        tokens, logprobs = _sample_rows(logits, rows)  # (B,), (B,)
        finished = []
        for key, row, token, logprob in zip(keys, rows, tokens.tolist(), logprobs.tolist()):
            row.cached.extend(row.pending)  # type: ignore[arg-type]
            row.pending = None
            row.turn_ids.append(token)
            row.turn_logprobs.append(logprob)
            if self.chat_format.ends_turn(row.turn_ids):
                stop = "stop_token" if token in self.chat_format.stop_token_ids else "tool_call"
            elif row.stop_strings and self._ends_with_stop_string(row):
                stop = "stop_string"
            elif len(row.turn_ids) >= row.max_new_tokens:
                stop = "length"
            else:
                row.pending = [token]
                continue
            finished.append(TurnOutput(key, row.turn_ids, row.turn_logprobs, stop))
            row.last_token, row.turn_ids, row.turn_logprobs = token, [], []
        return finished

    def _ends_with_stop_string(self, row: _RowState) -> bool:
        """True when the turn's text now contains a stop string. Checked after every token, so one
        found is new; the tail decoded covers the longest stop string even at 4 byte-tokens per
        character (byte-level BPE), plus one token for a boundary."""
        tail = 4 * max(len(text) for text in row.stop_strings) + 1
        text = self.chat_format.decode_turn(row.turn_ids[-tail:])
        return any(stop in text for stop in row.stop_strings)

    def _share_prompt_prefix(self, rows: list[_RowState]) -> None:
        """Prefill each new episode's prompt only where no cache holds it yet.

        The G episodes of a prompt have identical prompts, and all episodes of an env share its
        system prompt and tool schemas, so most prompt tokens are common. Two ways to reuse them,
        both copying a KV cache that is exactly what a prefill would compute:
          * a new episode whose prompt starts like the cache of an episode already running (one
            admitted when a slot frees up, or the next token sequence of an episode whose history
            is not a prefix, engine.py) forks that longest common prefix from it;
          * the new episodes left, when several start in one step, prefill their longest common
            prefix once in the first one's slot, and the others fork it.
        Only the differing suffixes are prefilled per episode. At least one token of every prompt
        stays in its own chunk, to produce its logits.
        """
        if type(self.runner).fork is Runner.fork:  # this runner cannot copy caches
            return
        new = [row for row in rows if self.runner.length(row.slot) == 0 and row.pending]
        if not new:
            return
        self._fork_from_running(new)
        new = [row for row in new if self.runner.length(row.slot) == 0]
        if len(new) < 2:
            return
        prefix = min(len(row.pending) for row in new) - 1  # type: ignore[arg-type]
        first = new[0].pending
        for row in new[1:]:
            same = 0
            for a, b in zip(first[:prefix], row.pending[:prefix]):  # type: ignore[index]
                if a != b:
                    break
                same += 1
            prefix = same
        if prefix < self.min_shared_prefix:
            return
        self.runner.forward([new[0].slot], [first[:prefix]])  # type: ignore[index]
        self.forward_calls += 1
        for row in new[1:]:
            self.runner.fork(new[0].slot, row.slot, prefix)
        for row in new:
            row.cached = list(first[:prefix])  # type: ignore[index]
            row.pending = row.pending[prefix:]  # type: ignore[index]

    def _fork_from_running(self, new: list[_RowState]) -> None:
        """Fork into each new row the longest prefix of its prompt that a running row's cache
        holds (at least `min_shared_prefix` tokens; a row forked here may serve the next one)."""
        sources = [row for row in self._rows.values() if row.cached]
        for row in new:
            pending = row.pending
            assert pending is not None
            best, source = 0, None
            for other in sources:
                same = _common_prefix_length(other.cached, pending, len(pending) - 1)
                if same > best:
                    best, source = same, other
            if source is None or best < self.min_shared_prefix:
                continue
            self.runner.fork(source.slot, row.slot, best)
            self.prefix_forks += 1
            row.cached, row.pending = list(pending[:best]), pending[best:]
            sources.append(row)


def _common_prefix_length(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens a and b share, at most `limit`."""
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _sample_rows(logits: torch.Tensor, rows: list[_RowState]) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row, each row with its own episode's sampling parameters. logits (B, V) -> (B,), (B,).

    Rows are sampled in groups of equal parameters; each row draws from its own generator, so
    the grouping changes no row's sample (sampling.py: one uniform per row and token)."""
    groups: dict[SamplingParams, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(row.sampling, []).append(index)
    if len(groups) == 1:
        return sample(logits, rows[0].sampling, [row.generator for row in rows])
    tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)  # (B,)
    logprobs = torch.empty(len(rows), dtype=torch.float32, device=logits.device)  # (B,)
    for params, indices in groups.items():
        where = torch.tensor(indices, device=logits.device)
        group_tokens, group_logprobs = sample(logits[where], params, [rows[i].generator for i in indices])
        tokens[where], logprobs[where] = group_tokens, group_logprobs.float()
    return tokens, logprobs
