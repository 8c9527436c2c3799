"""FastRunner's KV cache: fixed slots in one preallocated tensor, forks, and a shared-prefix store.

What. `SlotKVCache` holds the keys and values of up to `max_slots` sequences:

    kv: (layers, slots, 2, nkv, max_len, hd)      [:, s, 0] keys of slot s, [:, s, 1] its values

A slot's id is its row in `kv`. `alloc` hands out the lowest free id, which keeps the slots that
decode together compact: the attention then reads them as one range view of the cache instead of
gathering rows (see fast_attention.py). `fork(source, target, length)` copies the first `length`
positions of a slot into an empty one, so G episodes of a prompt (and every episode's system
prompt and tool schemas) are prefilled once.

Why preallocated. One tensor, written in place by index, costs no allocation per token and lets
a batched call address any set of slots with one index_put. Its size is about
`2·layers·nkv·hd·bytes` per token per slot (46 KB for SmolLM2-135M fp32, so 32 slots × 2048
tokens = 3 GB); it is allocated with `torch.empty`, so on CPU untouched memory is never committed.

Invariant: every key a call reads is finite. Attention masks keys it must not see, but a masked
NaN or inf still poisons the softmax, and `torch.empty` memory is garbage. So each row is zeroed
lazily, in blocks of `ZERO_BLOCK` positions, up to the furthest position a call reads
(`ensure_zeroed`), and a freed row's old K/V are finite and invisible to its next owner.

The shared-prefix store (`PrefixStore`). When a `fork` shares at least `min_tokens` positions,
the store keeps one extra copy of the forked prefix's K/V and records, per slot, how many of its
first positions equal the store's. A call whose slots all share the store's first P positions
attends those P keys once for all its queries (see fast_attention.py). Each slot keeps its own
copy of the prefix too, so nothing depends on the store staying put: a fork from a slot whose
cache starts with the store's K/V joins it (episodes admitted while others run); a fork of
another prefix replaces the store, and the earlier slots fall back to attending their own copy.

Shape legend: nkv key/value heads, hd head dim, P shared-prefix positions.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

ZERO_BLOCK = 256  # cache rows are zeroed lazily in blocks of this many positions


class PrefixStore:
    """One copy of the K/V of the last forked prefix, and how much of it each slot shares."""

    def __init__(self, max_slots: int, min_tokens: int) -> None:
        self.min_tokens = min_tokens  # a prefix shorter than this is not attended once per call
        self.kv: torch.Tensor | None = None  # (layers, 2, nkv, length, hd)
        self.layer_keys_values: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer (K, V): (nkv, length, hd)
        self.generation = 0  # bumped whenever the store is rewritten
        self._shared: list[tuple[int, int] | None] = [None] * max_slots  # slot -> (generation, positions shared)

    def forget(self, slot: int) -> None:
        self._shared[slot] = None

    def record_fork(self, cache_kv: torch.Tensor, source: int, target: int, length: int) -> None:
        """`target` got the first `length` positions of `source` (already copied in `cache_kv`)."""
        shared = self._shared[source]
        if shared is None or shared[0] != self.generation:
            shared = self._shared[source] = self._join_or_replace(cache_kv, source, length)
        self._shared[target] = (shared[0], min(shared[1], length))

    def _join_or_replace(self, cache_kv: torch.Tensor, source: int, length: int) -> tuple[int, int]:
        """`source` shares the store's first c positions if they hold exactly its own K/V (episodes
        admitted later with the same prompt prefix join the running ones), else its first `length`
        positions become the store. Returns (store generation, c)."""
        store = self.kv
        if store is not None:
            m = min(store.shape[3], length)
            same = (store[:, :, :, :m] == cache_kv[:, source, :, :, :m]).transpose(0, 3).reshape(m, -1).all(1)  # (m,)
            c = int(same.int().cumprod(0).sum())  # leading positions that match
            if c >= max(1, self.min_tokens):
                return self.generation, c
        self.kv = cache_kv[:, source, :, :, :length].clone()
        self.layer_keys_values = [(layer[0], layer[1]) for layer in self.kv.unbind(0)]
        self.generation += 1
        return self.generation, length

    def shared_length(self, slots: Sequence[int]) -> int:
        """P: positions at the start of every slot's cache that equal the store's (0: none shared)."""
        common = None
        for s in slots:
            shared = self._shared[s]
            if shared is None or shared[0] != self.generation:
                return 0
            common = shared[1] if common is None else min(common, shared[1])
        return common if common is not None and common >= self.min_tokens else 0


class CacheMemoryError(ValueError):
    """The cache would not fit in its device's memory; the message names what it needs and has."""


def device_memory(device: torch.device) -> int | None:
    """All the memory `device` has, in bytes: RAM plus swap (CPU), the GPU's total (CUDA); None if unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type != "cpu":
        return None
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    swap = 0
    try:
        with open("/proc/meminfo") as meminfo:
            swap = next((int(line.split()[1]) * 1024 for line in meminfo if line.startswith("SwapTotal:")), 0)
    except OSError:
        pass
    return ram + swap


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


class SlotKVCache:
    """K/V of `max_slots` sequences of up to `max_len` positions each; see the module docstring.

    A cache bigger than all its device's memory (RAM and swap on a CPU) is refused before anything
    is allocated (CacheMemoryError, naming both sizes): every slot may fill to `max_len`, so it
    could only end in the kernel's out-of-memory kill mid-run. One that fits in total but cannot be
    reserved now (a GPU already holding other tensors) gets the same error from the allocator's."""

    def __init__(
        self,
        n_layers: int,
        max_slots: int,
        max_len: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        shared_prefix: int,
    ) -> None:
        """`shared_prefix`: the fewest forked positions worth attending once per call (0: no store)."""
        self.max_slots, self.max_len = max_slots, max_len
        shape = (n_layers, max_slots, 2, n_kv_heads, max_len, head_dim)
        per_position = n_layers * 2 * n_kv_heads * head_dim * dtype.itemsize
        need, has = per_position * max_slots * max_len, device_memory(torch.device(device))
        what = (
            f"the KV cache of {max_slots:,} sequences × {max_len:,} positions needs {_gib(need)} "
            f"({per_position / 1024:,.1f} KiB a position)"
        )
        if has is not None and need > has:
            raise CacheMemoryError(f"{what}, more than all of {device}'s memory ({_gib(has)})")
        try:
            self.kv = torch.empty(shape, dtype=dtype, device=device)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            raise CacheMemoryError(
                f"{what}, which {device} cannot reserve now ({str(exc).splitlines()[0][:200]})"
            ) from None
        self.layers = list(self.kv.unbind(0))  # per layer (slots, 2, nkv, max_len, hd), hoisted out of forward
        self.layer_keys_values = [
            (c[:, 0], c[:, 1]) for c in self.layers
        ]  # per layer (K, V), (slots, nkv, max_len, hd)
        self.lengths: list[int | None] = [None] * max_slots  # None: free
        self.prefix_store = PrefixStore(max_slots, shared_prefix) if shared_prefix else None
        self._zeroed = [0] * max_slots  # positions [0, z) of each cache row hold finite values
        self._free = list(range(max_slots))  # kept sorted: alloc hands out the lowest id

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.max_slots} slots are in use (max_slots={self.max_slots}); free one first")
        slot = self._free.pop(0)
        self.lengths[slot] = 0
        if self.prefix_store is not None:
            self.prefix_store.forget(slot)
        return slot

    def free(self, slot: int) -> None:
        self.check_slot(slot)
        self.lengths[slot] = None
        if self.prefix_store is not None:
            self.prefix_store.forget(slot)
        self._free.append(slot)
        self._free.sort()

    def length(self, slot: int) -> int:
        self.check_slot(slot)
        return self.lengths[slot]  # type: ignore[return-value]

    def check_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or not (0 <= slot < self.max_slots) or self.lengths[slot] is None:
            raise KeyError(f"slot {slot!r} is not allocated")

    def fork(self, source: int, target: int, length: int) -> None:
        """Copy the first `length` cached positions of `source` into the empty slot `target`."""
        self.check_slot(source)
        self.check_slot(target)
        if self.lengths[target] != 0:
            raise ValueError(f"fork target slot {target} must be empty, it holds {self.lengths[target]} tokens")
        if not 0 < length <= self.lengths[source]:  # type: ignore[operator]
            raise ValueError(f"fork length {length} must be in [1, {self.lengths[source]}] for slot {source}")
        self.ensure_zeroed([target], length)
        self.kv[:, target, :, :, :length].copy_(self.kv[:, source, :, :, :length])
        self.lengths[target] = length
        if self.prefix_store is not None:
            self.prefix_store.record_fork(self.kv, source, target, length)

    def shared_prefix_length(self, slots: Sequence[int]) -> int:
        """P for a call on `slots`: the store's positions all of them share (0: attend each row whole)."""
        return 0 if self.prefix_store is None else self.prefix_store.shared_length(slots)

    def ensure_zeroed(self, rows: Sequence[int], key_end: int) -> None:
        """Make positions [0, key_end) of the given cache rows finite (masked keys must not be NaN)."""
        for r in rows:
            z = self._zeroed[r]
            if z < key_end:
                new = min(self.max_len, -(-max(key_end, z + ZERO_BLOCK) // ZERO_BLOCK) * ZERO_BLOCK)
                self.kv[:, r, :, :, z:new].zero_()
                self._zeroed[r] = new
