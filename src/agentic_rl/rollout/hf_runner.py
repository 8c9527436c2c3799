"""`HFRunner`: the reference `Runner`, a transformers causal LM with one batched KV cache.

    runner = HFRunner(model, max_slots=32, max_len=2048)
    slot = runner.alloc()
    logits = runner.forward([slot], [prompt_ids])      # (1, V) fp32

Cache layout. One `DynamicCache` holds the rows of the slots named in the last `forward`, in a
shared column space; a 2D validity mask marks which columns of each row hold real tokens:

    row a   . . P P P P A O O O O A .        P prompt, A policy token, O observation
    row b   P P P P P P A A . . . A A        . hole: padding, attention 0, never attended
            <------ cache columns ------>

  * Ragged chunks are right-padded to the longest chunk of the call. Each row's position ids
    are its own token count (so RoPE sees the true positions), the padded columns become holes.
  * The attention mask is built here as a 4D additive mask (B, 1, c, L + c): causal in columns,
    and 0 on holes. transformers passes a 4D mask through unchanged.
  * The LM head runs only on the hidden state of each chunk's last real token
    (`model.model(...)` then `model.lm_head` on the gathered rows).
  * Slots not named in a call cost no compute: when the named set changes, the cache is
    regrouped. A pure shrink selects rows (one index_select per layer); anything else
    (a slot rejoins, a new slot) rebuilds the cache from each row's valid columns, left-padded,
    which also squeezes out the holes. Rows that leave are parked as compact per-slot tensors.
    Regrouping copies the whole cache, so a caller should keep the named set stable while it can
    (the engine does: rows leave only at turn ends and rejoin with their observation prefill).

This is the slow, obviously-correct path; `FastRunner` is the lean one. Both must match a plain
full forward pass within 1e-4 in fp32 (tests/test_rollout_engine.py checks this one).
Shapes: B rows, c chunk width, L cache columns, H hidden, V vocabulary, h kv heads, d head dim.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from agentic_rl.models.backbone import cache_name
from agentic_rl.rollout.runner import Runner

_LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (1, h, n, d)


class HFRunner(Runner):
    """The reference runner. See the module docstring for the cache layout."""

    def __init__(self, model: PreTrainedModel, max_slots: int = 64, max_len: int = 4096) -> None:
        if not hasattr(model, "model") or not hasattr(model, "lm_head"):
            raise ValueError("HFRunner needs a *ForCausalLM model with `.model` (backbone) and `.lm_head`")
        self.model = model.eval()
        self.max_slots = max_slots
        self.max_len = max_len
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._free = list(range(max_slots - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._lengths: dict[int, int] = {}  # slot -> real tokens in its cache
        self._parked: dict[int, _LayerKV | None] = {}  # slot -> compact KV while out of the batch
        self._rows: list[int] = []  # slots in the batched cache, in row order
        self._cache: DynamicCache | None = None
        self._cache_name = cache_name(
            model.model
        )  # the backbone's name for its cache (transformers 5.17: past_key_values)
        self._valid = torch.zeros((0, 0), dtype=torch.bool, device=self.device)  # (B, L)

    # ------------------------------------------------------------------ Runner API

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.max_slots} slots are in use; free one or raise max_slots")
        slot = self._free.pop()
        self._lengths[slot] = 0
        self._parked[slot] = None
        return slot

    def free(self, slot: int) -> None:
        self._require_slot(slot)
        if slot in self._rows:
            keep = [row for row, s in enumerate(self._rows) if s != slot]
            self._select_rows(keep)
        del self._lengths[slot]
        self._parked.pop(slot, None)
        self._free.append(slot)

    def length(self, slot: int) -> int:
        self._require_slot(slot)
        return self._lengths[slot]

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Nothing to do: every forward reads the model's live parameters."""

    def forward(self, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        slots = list(slots)
        if len(slots) != len(chunks) or not slots:
            raise ValueError(
                f"forward needs one non-empty chunk per slot, got {len(slots)} slots, {len(chunks)} chunks"
            )
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot is named twice in one forward call: {slots}")
        for slot, chunk in zip(slots, chunks):
            self._require_slot(slot)
            if len(chunk) == 0:
                raise ValueError(f"empty chunk for slot {slot}")
            if self._lengths[slot] + len(chunk) > self.max_len:
                raise ValueError(
                    f"slot {slot} would hold {self._lengths[slot] + len(chunk)} tokens > max_len {self.max_len}"
                )
        if set(slots) != set(self._rows):
            self._regroup(slots)
        elif self._valid.shape[1] > 64 and self._valid.float().mean() < 0.5:
            # More holes than tokens (ragged calls piled up): squeeze them out.
            self._build([self._extract(row) for row in range(len(self._rows))], list(self._rows))
        row_of = {slot: row for row, slot in enumerate(self._rows)}
        ordered = [None] * len(slots)
        for slot, chunk in zip(slots, chunks):
            ordered[row_of[slot]] = list(chunk)
        logits = self._forward_rows(ordered)  # (B, V) in row order
        back = torch.tensor([row_of[slot] for slot in slots], device=self.device)
        return logits.index_select(0, back)

    # ------------------------------------------------------------------ internals

    def _forward_rows(self, chunks: list[list[int]]) -> torch.Tensor:
        """Append chunks (row order) to the batched cache; logits after each chunk's last token."""
        batch, width = len(chunks), max(len(c) for c in chunks)
        past = self._valid.shape[1]
        input_ids = torch.zeros((batch, width), dtype=torch.long, device=self.device)  # (B, c)
        new_valid = torch.zeros((batch, width), dtype=torch.bool, device=self.device)  # (B, c)
        starts = torch.tensor([self._lengths[s] for s in self._rows], device=self.device)  # (B,)
        for row, chunk in enumerate(chunks):
            input_ids[row, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
            new_valid[row, : len(chunk)] = True
        position_ids = starts[:, None] + torch.arange(width, device=self.device)[None, :]  # (B, c)
        valid = torch.cat([self._valid, new_valid], dim=1)  # (B, L + c)
        query_column = past + torch.arange(width, device=self.device)  # (c,)
        causal = torch.arange(past + width, device=self.device)[None, :] <= query_column[:, None]  # (c, L + c)
        allowed = causal[None, :, :] & valid[:, None, :]  # (B, c, L + c)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
        out = self.model.model(
            input_ids=input_ids,
            attention_mask=mask[:, None, :, :],  # (B, 1, c, L + c)
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_name: self._cache},
        )
        last = torch.tensor([len(c) - 1 for c in chunks], device=self.device)  # (B,)
        hidden = out.last_hidden_state[torch.arange(batch, device=self.device), last]  # (B, H)
        logits = self.model.lm_head(hidden).float()  # (B, V)
        self._valid = valid
        for slot, chunk in zip(self._rows, chunks):
            self._lengths[slot] += len(chunk)
        return logits

    def _regroup(self, slots: list[int]) -> None:
        """Make the batched cache hold exactly `slots` (rows in that order)."""
        staying = [s for s in slots if s in self._rows]
        if len(staying) == len(slots):  # pure shrink: select rows, keep holes
            for slot in self._rows:
                if slot not in slots:
                    self._parked[slot] = self._extract(self._rows.index(slot))
            self._select_rows([self._rows.index(s) for s in slots])
            return
        compact: dict[int, _LayerKV | None] = {}
        for row, slot in enumerate(self._rows):
            compact[slot] = self._extract(row)
        for slot in slots:
            if slot not in compact:
                compact[slot] = self._parked.get(slot)
        for slot in self._rows:
            if slot not in slots:
                self._parked[slot] = compact[slot]
        for slot in slots:
            self._parked[slot] = None
        self._build([compact[s] for s in slots], slots)

    def _extract(self, row: int) -> _LayerKV | None:
        """A row's valid columns, compacted: per layer (1, h, n, d)."""
        if self._cache is None or self._lengths[self._rows[row]] == 0:
            return None
        columns = self._valid[row].nonzero().squeeze(1)  # (n,)
        return [
            (layer.keys[row : row + 1].index_select(2, columns), layer.values[row : row + 1].index_select(2, columns))
            for layer in self._cache.layers
        ]

    def _build(self, per_row: list[_LayerKV | None], slots: list[int]) -> None:
        """A fresh batched cache from compact rows, left-padded to the longest."""
        self._rows = list(slots)
        lengths = [0 if kv is None else kv[0][0].shape[2] for kv in per_row]
        width = max(lengths)
        self._valid = torch.zeros((len(slots), width), dtype=torch.bool, device=self.device)  # (B, L)
        for row, n in enumerate(lengths):
            self._valid[row, width - n :] = True
        self._cache = DynamicCache(config=self.model.config)
        if width == 0:
            return
        template = next(kv for kv in per_row if kv is not None)
        for layer_index in range(len(template)):
            keys, values = [], []
            for kv, n in zip(per_row, lengths):
                ref_k, ref_v = template[layer_index]
                pad_k = ref_k.new_zeros((1, ref_k.shape[1], width - n, ref_k.shape[3]))
                pad_v = ref_v.new_zeros((1, ref_v.shape[1], width - n, ref_v.shape[3]))
                keys.append(pad_k if kv is None else torch.cat([pad_k, kv[layer_index][0]], dim=2))
                values.append(pad_v if kv is None else torch.cat([pad_v, kv[layer_index][1]], dim=2))
            self._cache.update(torch.cat(keys, dim=0), torch.cat(values, dim=0), layer_index)  # (B, h, L, d)

    def _select_rows(self, rows: list[int]) -> None:
        """Keep only `rows` of the batched cache (in that order); trim columns that are holes in every row."""
        if not rows:
            self._rows, self._cache = [], None
            self._valid = torch.zeros((0, 0), dtype=torch.bool, device=self.device)
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self._rows = [self._rows[r] for r in rows]
        self._valid = self._valid.index_select(0, index)
        if self._cache is not None and self._cache.get_seq_length() > 0:
            self._cache.batch_select_indices(index)
        used = self._valid.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else self._valid.shape[1]
        if first > 0 and self._cache is not None:
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self._valid = self._valid[:, first:]

    def _require_slot(self, slot: int) -> None:
        if slot not in self._lengths:
            raise ValueError(f"slot {slot} is not allocated")
