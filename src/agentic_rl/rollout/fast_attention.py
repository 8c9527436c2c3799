"""FastRunner's attention: ragged chunks packed into one token batch, their masks, and the shared prefix.

Shape legend (every trailing comment below uses it):
    n    slots named in one `forward` call
    B    cache rows the call attends: n, or a compact range of slot ids with unnamed dummy rows
    T    tokens of all chunks, packed (the sum of the chunk lengths)
    Lq   the longest chunk: queries per row once rows are padded to a grid
    Lk   keys per row: the furthest cache position the call reaches (max over rows of start + chunk)
    P    shared-prefix keys attended once for every row (0: none)
    nkv  key/value heads;  g  query heads per KV head;  hd  head dim

Packing. Each call appends a ragged chunk of tokens to each named slot. The projections and MLP
run on the T tokens packed back to back (in slot order: no padding FLOPs); attention runs on a
padded grid of B rows × Lq queries, because SDPA wants a dense batch. `PackedChunks` holds both
layouts and the maps between them:

    packed tokens (T)     a0 a1 a2 | b0 | c0 c1             slots a < b < c, chunks of 3, 1, 2
    row grid (B × Lq)     a0 a1 a2 / b0 .  . / c0 c1 .      "." padding queries, discarded

Rows. When the sorted slot ids span at most 2·n rows, the call attends the range of cache rows
[first_row, last_row] as a view (no copy); rows in the range that the call does not name are
computed as masked dummies and discarded. Otherwise the named rows are gathered (a copy per
layer). A plain decode step over a compact range (every chunk one token, every row named) needs
no re-layout at all (`plain_decode`).

Masks. Query i of row b sits at position start_b + i and sees key j iff j <= start_b + i (causal
over the row's own cache). Padding and dummy queries see only key P (the row's first own key),
so their softmax is finite; their outputs are discarded. GQA needs no repeat of K/V: the g query
heads of a KV head become g·Lq query rows of one SDPA call against that head's keys.

Shared prefix (`attend_with_shared_prefix`). The engine prefills the prompt prefix its episodes
share (system prompt, tool schemas) once and forks it into every slot (fast_kv_cache.py), so
each decode step would read those K/V rows once per slot. When every row of a call shares the
store's first P positions, attention runs in two parts: every query of every row against the P
prefix keys in one call (T·g query rows per KV head instead of g), and each row's queries against
its own keys [P, Lk). The CPU flash kernel returns each part's log-sum-exp, and the exact softmax
over the union is their mix:

    o = o_row + (o_pre − o_row)·σ(lse_pre − lse_row)

This needs the kernel's log-sum-exp, which only the CPU flash kernel returns here, so FastRunner
uses the shared prefix on CPU only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

# the CPU flash kernel that also returns each query's log-sum-exp (shared-prefix attention merges on it)
FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(frozen=True)
class PackedChunks:
    """One call's tokens, packed, and the padded row grid attention runs on. See the module docstring."""

    sorted_slots: list[int]  # the n named slots, ascending: the packing order
    rows: list[int]  # the B cache rows attended, ascending
    rows_are_range: bool  # rows == range(first_row, last_row + 1): attend a view, no gather
    first_row: int
    last_row: int
    gathered_rows: torch.Tensor | None  # (B,) the rows as an index, when they are gathered
    num_rows: int  # B
    num_tokens: int  # T
    max_chunk: int  # Lq
    key_end: int  # Lk
    plain_decode: bool  # Lq == 1 and B == n: the grid is the packing itself
    no_padding: bool  # B == n and T == B·Lq: the grid holds no padding query
    token_ids: torch.Tensor  # (T,)
    token_slots: torch.Tensor  # (T,) the slot (cache row) of each token
    token_positions: torch.Tensor  # (T,) its position in that slot's cache
    grid_index: torch.Tensor  # (T,) its place in the flattened (B·Lq) grid
    last_tokens: torch.Tensor  # (n,) packed index of each slot's last token, in the caller's order
    row_starts: torch.Tensor  # (B,) cached positions before the call
    row_chunk_lengths: torch.Tensor  # (B,) new tokens per row (0 for a dummy row)

    def to_grid(self, q: torch.Tensor, n_kv: int, group: int, head_dim: int) -> torch.Tensor:
        """(T, nkv·g·hd) packed queries -> (B, nkv, g·Lq, hd): per KV head, its g heads' queries as rows."""
        B, lq = self.num_rows, self.max_chunk
        if self.plain_decode:
            return q.view(B, n_kv, group, head_dim)
        padded = q if self.no_padding else q.new_zeros(B * lq, q.shape[1]).index_copy_(0, self.grid_index, q)
        return padded.view(B, lq, n_kv, group, head_dim).permute(0, 2, 3, 1, 4).reshape(B, n_kv, group * lq, head_dim)

    def to_tokens(self, t: torch.Tensor, n_kv: int, group: int) -> torch.Tensor:
        """(B, nkv, g·Lq, *rest) per-row attention results -> (T, nkv, g, *rest) in packed token order."""
        B, lq = self.num_rows, self.max_chunk
        rest = t.shape[3:]
        if self.plain_decode:
            return t.view(B, n_kv, group, *rest)
        t = t.view(B, n_kv, group, lq, *rest).movedim(3, 1).reshape(B * lq, n_kv, group, *rest)
        return t if self.no_padding else t.index_select(0, self.grid_index)


def pack_chunks(
    slots: Sequence[int], chunks: Sequence[Sequence[int]], lengths: Sequence[int | None], device: torch.device
) -> PackedChunks:
    """Pack `chunks[i]`, appended to slot `slots[i]` whose cache holds `lengths[slots[i]]` tokens."""
    n = len(slots)
    order = sorted(range(n), key=slots.__getitem__)
    sorted_slots = [slots[i] for i in order]
    first, last = sorted_slots[0], sorted_slots[-1]
    rows_are_range = last - first + 1 <= 2 * n
    rows = list(range(first, last + 1)) if rows_are_range else sorted_slots
    B = len(rows)
    row_of_slot = {s: (s - first if rows_are_range else b) for b, s in enumerate(sorted_slots)}
    lq = max(len(c) for c in chunks)
    row_starts = [0] * B
    row_chunk_lengths = [0] * B
    token_ids: list[int] = []
    token_slots: list[int] = []
    token_positions: list[int] = []
    grid_index: list[int] = []
    first_token: dict[int, int] = {}
    key_end = 1
    chunk_of = dict(zip(slots, chunks))
    for s in sorted_slots:  # tokens are packed in slot order; `last_tokens` maps back to the caller's order
        chunk = chunk_of[s]
        L = len(chunk)
        start = lengths[s]
        b = row_of_slot[s]
        row_starts[b], row_chunk_lengths[b] = start, L
        first_token[s] = len(token_ids)
        token_ids.extend(int(t) for t in chunk)
        token_slots.extend([s] * L)
        token_positions.extend(range(start, start + L))  # type: ignore[arg-type]
        grid_index.extend(range(b * lq, b * lq + L))
        key_end = max(key_end, start + L)  # type: ignore[operator]
    T = len(token_ids)
    last_tokens = [first_token[s] + len(chunk_of[s]) - 1 for s in slots]
    # one host-to-device copy for every index of the call
    flat = torch.tensor(
        token_ids + token_slots + token_positions + grid_index + last_tokens + row_starts + row_chunk_lengths,
        dtype=torch.long,
    ).to(device, non_blocking=True)
    return PackedChunks(
        sorted_slots=sorted_slots,
        rows=rows,
        rows_are_range=rows_are_range,
        first_row=first,
        last_row=last,
        gathered_rows=None if rows_are_range else torch.tensor(rows, device=device),
        num_rows=B,
        num_tokens=T,
        max_chunk=lq,
        key_end=key_end,
        plain_decode=lq == 1 and B == n,
        no_padding=B == n and T == B * lq,
        token_ids=flat[:T],
        token_slots=flat[T : 2 * T],
        token_positions=flat[2 * T : 3 * T],
        grid_index=flat[3 * T : 4 * T],
        last_tokens=flat[4 * T : 4 * T + n],
        row_starts=flat[4 * T + n : 4 * T + n + B],
        row_chunk_lengths=flat[4 * T + n + B :],
    )


def attention_mask(
    packed: PackedChunks, shared_len: int, group: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The mask of each row's queries over its own keys [P, Lk), in the layout SDPA takes:
    (B, 1, 1, Lk - P) for Lq == 1 (broadcast over the g query rows), else (B, 1, g·Lq, Lk - P).

    Boolean (True: visible), or additive in `dtype` (0 / -inf) when P > 0: the kernel that returns
    log-sum-exps takes only that form.
    """
    B, lq, key_end = packed.num_rows, packed.max_chunk, packed.key_end
    query_offsets = torch.arange(lq, device=device)
    keys = torch.arange(shared_len, key_end, device=device)
    query_positions = packed.row_starts[:, None] + query_offsets[None, :]  # (B, Lq)
    mask = keys[None, None, :] <= query_positions[:, :, None]  # (B, Lq, Lk - P)
    if not packed.no_padding:
        padding = query_offsets[None, :] >= packed.row_chunk_lengths[:, None]  # (B, Lq)
        mask = torch.where(padding[:, :, None], keys[None, None, :] == shared_len, mask)
    if lq == 1:
        mask = mask[:, None]  # (B, 1, 1, Lk - P)
    else:
        mask = (
            mask[:, None, None]
            .expand(B, 1, group, lq, key_end - shared_len)
            .reshape(B, 1, group * lq, key_end - shared_len)
        )
    if shared_len:
        mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
    return mask


def attend_with_shared_prefix(
    q: torch.Tensor,
    grid_queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    prefix_keys: torch.Tensor,
    prefix_values: torch.Tensor,
    scale: float,
    to_tokens: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Attention output (T, nkv·g·hd) of the packed queries over a shared prefix plus each row's keys.

    q: (T, nkv·g·hd) packed queries; grid_queries: the same on the row grid, (B, nkv, g·Lq, hd);
    keys, values: (B, nkv, Lk - P, hd) each row's own keys after the prefix, under the additive
    `mask`; prefix_keys, prefix_values: (nkv, P, hd); `to_tokens` maps grid results
    (B, nkv, g·Lq, *rest) to packed token order (T, nkv, g, *rest). All in the compute dtype.

    The prefix keys are the same for every row, so all T·g queries of a KV head attend them in
    one call; softmax over the union is the two partial outputs weighted by their shares of the
    total mass: o = o_row + (o_pre − o_row)·σ(lse_pre − lse_row).
    """
    T = q.shape[0]
    n_kv, _, head_dim = prefix_keys.shape
    group = q.shape[1] // (n_kv * head_dim)
    queries = q.view(T, n_kv, group, head_dim).transpose(0, 1).reshape(1, n_kv, T * group, head_dim)
    o_pre, lse_pre = FLASH_CPU(queries, prefix_keys[None], prefix_values[None], 0.0, False, scale=scale)
    o_pre = o_pre.view(n_kv, T, group, head_dim).transpose(0, 1)  # (T, nkv, g, hd)
    lse_pre = lse_pre.view(n_kv, T, group).transpose(0, 1)  # (T, nkv, g)
    o_row, lse_row = FLASH_CPU(grid_queries, keys, values, 0.0, False, attn_mask=mask, scale=scale)
    o_row, lse_row = to_tokens(o_row), to_tokens(lse_row)  # (T, nkv, g, hd), (T, nkv, g)
    share = torch.sigmoid(lse_pre - lse_row).unsqueeze(-1)  # (T, nkv, g, 1) float32
    compute_dtype = q.dtype
    if compute_dtype != torch.float32:
        o_pre, o_row = o_pre.float(), o_row.float()
    return torch.lerp(o_row, o_pre, share).to(compute_dtype).reshape(T, n_kv * group * head_dim)
