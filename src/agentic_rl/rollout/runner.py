"""The model runner interface: a KV cache of many sequences, extended in ragged chunks.

The rollout engine never calls a model directly. It asks a runner to append tokens to
sequences that live in slots, and gets back the next-token logits of each. Prefill of a
prompt, prefill of an observation after a tool call, and one decode step are all the same
call: `forward(slots, chunks)`. The KV cache of a slot lives across turns, so an observation
costs only its own tokens, never a re-encode of the prefix.

    runner = HFRunner(model, max_slots=32, max_len=2048)
    a, b = runner.alloc(), runner.alloc()
    logits = runner.forward([a, b], [prompt_a, prompt_b])   # (2, V) fp32: next-token logits
    logits = runner.forward([a], [[tok]])                     # decode one token for `a` only
    runner.free(b)

Implementations: `HFRunner` (reference: the transformers model with its own cache) and
`FastRunner` (a lean decode path for Llama/Qwen3 families). Both must give the logits a plain
forward pass over the whole sequence gives, within 1e-4 in fp32. The engine reaches a runner
through `RunnerBackend` (rollout/backend.py), which adds sampling and turn boundaries.
"""

from __future__ import annotations

import abc
from typing import Sequence

import torch


class Runner(abc.ABC):
    """Holds the KV caches of up to `max_slots` sequences of up to `max_len` tokens each."""

    max_slots: int
    max_len: int

    @abc.abstractmethod
    def alloc(self) -> int:
        """Reserve an empty slot and return its id. Raises RuntimeError when all are in use."""

    @abc.abstractmethod
    def free(self, slot: int) -> None:
        """Release a slot; its cache is discarded."""

    @abc.abstractmethod
    def length(self, slot: int) -> int:
        """How many tokens the slot's cache holds."""

    def fork(self, source: int, target: int, length: int) -> None:
        """Make empty slot `target` hold a copy of the first `length` cached tokens of `source`.

        Lets G episodes of one prompt (and all episodes sharing a system prompt) prefill the
        shared prefix once. Optional: runners without it raise NotImplementedError and the
        caller prefills normally.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot fork slots")

    @abc.abstractmethod
    def sync_weights(self) -> None:
        """Compute with the model's current parameters from the next `forward` on. Called after every
        optimizer step and checkpoint load. A runner that reads the live parameters has nothing to
        do; one that computes from copies of them (FastRunner) must re-read them."""

    @abc.abstractmethod
    def forward(self, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """Append `chunks[i]` (non-empty) to slot `slots[i]`'s cache and return the logits
        after the last appended token of each: (len(slots), V) float32.

        Slots not named are untouched and cost no compute.
        """
