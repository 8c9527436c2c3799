"""`FastRunner`: a lean decode path for Llama and Qwen3 models, built from the HF weights.

The interface is `Runner` (see runner.py): slots, and `forward(slots, chunks)` that appends
ragged token chunks to slot caches and returns the fp32 next-token logits after each chunk.
Prefill of a prompt, of an observation, and a batched one-token decode step are the same call.

    runner = FastRunner(model, max_slots=32, max_len=2048)       # the model's dtype and device
    a, b = runner.alloc(), runner.alloc()
    logits = runner.forward([a, b], [prompt_a, prompt_b])          # (2, V) float32
    logits = runner.forward([a, b], [[tok_a], [tok_b]])            # one decode step
    ...
    optimizer.step()
    runner.sync_weights()                                          # REQUIRED after every update

The design. On CPU, decoding a small model is bound by weight reads and by
per-op dispatch, not by arithmetic (BENCHMARKS.md). The weight reads are fixed by the precision;
what is left to cut is the op count and every byte read twice. So the runner computes from its
own copies of the weights, fused and folded so that a layer is few, wide ops; it keeps every
sequence's K/V in one preallocated cache, so that prefixes are forked instead of re-encoded; and
it attends a prefix that all rows of a call share once for all of them. Three modules, one idea
each, and this one composes them:

- fast_weights.py: the copies (q/k/v and gate/up fused, RMSNorm scales folded, RoPE pairs
  permuted, cast, LoRA merged, laid out for torch.mm or oneDNN) and their staleness check;
- fast_kv_cache.py: the slots, `fork`, lazy zeroing, and the shared-prefix store;
- fast_attention.py: packing ragged chunks into one token batch, the masks, and the
  shared-prefix attention (two partial softmaxes merged on their log-sum-exps).

One layer is these ops, in this order (x: the (T, H) residual stream):

    rms_norm → one fused QKV projection → [Qwen3: per-head rms_norm · q/k scales]
    → RoPE on q and k together, one in-place complex multiply → one index_put of K/V into the cache
    → one SDPA call (GQA by reshape, no K/V repeat; or the shared-prefix pair)
    → o_proj added into x → rms_norm → one fused gate/up projection → silu(gate) · up in place
    → down_proj added into x

The LM head runs on the last token of each chunk only.

Mixed calls. Attention runs on a grid of rows padded to the call's longest chunk, so one slot
prefilling a tool observation of 50 tokens while 40 others decode one token each would give every
decoding row 50 queries over its whole cache, 49 of them padding. An agent's rollout is made of
such steps: episodes finish their turns at different times, and each next turn starts with its
observation. When the one-token chunks' padding would outnumber the call's real tokens, `forward`
runs them and the longer chunks as two calls: one more pass over the weights instead of attention
for up to Lq times the queries (benchmarks/mixed_calls.py measures it on plan's evaluation).

Invariants (tests/test_fast_runner.py proves them):
- The logits equal a plain forward of the HF model over each slot's whole history, within 1e-4
  in fp32, over random schedules of ragged calls, forks, frees and reused slots. bf16 copies of
  an fp32 model are a separate, approximate mode.
- Weights contract: the runner does not see weight updates by itself. Call `sync_weights()`
  after every optimizer step, checkpoint load or LoRA adapter change (the backend does, and owns
  the weights version the engine stamps on trajectories: rollout/backend.py). With `check_weights=True` (the
  default) `forward` raises instead of decoding from stale copies (see fast_weights.py for what
  is detected). Live slots keep the K/V computed with the old weights.
- A call that fails validation changes nothing.

Shape legend (see also fast_attention.py for the packing symbols):
    n    slots named in a call;  B  cache rows it attends;  T  tokens it packs
    Lq   the longest chunk (queries per row);  Lk  keys per row
    P    shared-prefix keys attended once for all rows (0: none)
    H    hidden size;  I  MLP intermediate size;  V  vocabulary
    nh   query heads;  nkv  key/value heads;  g = nh / nkv;  hd  head dim
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import torch.nn.functional as F

from agentic_rl.models.backbone import unwrap_causal_lm
from agentic_rl.rollout.fast_attention import PackedChunks, attend_with_shared_prefix, attention_mask, pack_chunks
from agentic_rl.rollout.fast_kv_cache import SlotKVCache
from agentic_rl.rollout.fast_weights import (
    PROJECTIONS,
    CopyFormat,
    SourceParameters,
    build_decode_weights,
    choose_linear,
)
from agentic_rl.rollout.runner import Runner

SUPPORTED_MODEL_TYPES = ("llama", "qwen3")


class FastRunner(Runner):
    """A lean Llama/Qwen3 forward over a preallocated slot KV cache. See the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_slots: int = 32,
        max_len: int = 2048,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        check_weights: bool = True,
        linear: str = "auto",
        shared_prefix: int = 64,
        split_mixed: bool = True,
    ) -> None:
        """`model`: a LlamaForCausalLM / Qwen3ForCausalLM, optionally peft-wrapped.
        `dtype`: compute dtype, default the model's own when it is fp32 or bf16 (else fp32);
        bf16 copies of an fp32 model are a separate, approximate mode. Logits
        are always returned as float32. `device`: default the model's.
        `linear`: how projections run. "mm": torch.mm/addmm on (out, in) copies in nn.Linear's
        layout (reusing unfused weights). "mkldnn": oneDNN linears on weights reordered once per
        sync into oneDNN's blocked layout (CPU only). "auto": "mkldnn" on a CPU with oneDNN,
        else "mm".
        `shared_prefix`: attend a prefix that every slot of a call got from the same `fork` once
        per call for all of them, when it is at least this many tokens (CPU; 0 = never). See
        "Shared prefix" in fast_attention.py.
        `split_mixed`: run a call's one-token chunks apart from its longer ones when their padding
        would outnumber its tokens ("Mixed calls" above; False: always one call, for benchmarks).
        """
        if max_slots < 1 or max_len < 1:
            raise ValueError("max_slots and max_len must be positive")
        self.model = model
        hf = unwrap_causal_lm(model)
        cfg = hf.config
        self._check_config(cfg)
        self.max_slots = int(max_slots)
        self.max_len = int(max_len)
        first = next(hf.parameters())
        self.device = torch.device(device) if device is not None else first.device
        self.dtype = dtype or (first.dtype if first.dtype in (torch.float32, torch.bfloat16) else torch.float32)
        self.check_weights = check_weights
        self.linear = choose_linear(linear, self.device, self.dtype)
        self._project, self._project_add = PROJECTIONS[self.linear]
        if shared_prefix < 0:
            raise ValueError(f"shared_prefix must be >= 0 tokens (0 = off), got {shared_prefix}")
        self.shared_prefix = (
            int(shared_prefix) if self.device.type == "cpu" else 0
        )  # the merge needs the CPU kernel's LSE
        self.shared_prefix_calls = 0
        """forward calls that attended a shared prefix once for all their slots (for tests and benchmarks)."""
        self.split_mixed = split_mixed
        self.split_calls = 0
        """forward calls run as two, one-token chunks apart from longer ones (for tests and benchmarks)."""

        self.n_layers = cfg.num_hidden_layers
        self.hidden = cfg.hidden_size
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if self.n_heads % self.n_kv:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        self.group = self.n_heads // self.n_kv
        self.intermediate = cfg.intermediate_size
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self.qk_norm = cfg.model_type == "qwen3"
        self.vocab_size = hf.lm_head.out_features if hasattr(hf, "lm_head") else cfg.vocab_size
        self._rope = self._rope_table(hf, cfg)
        self.cache = SlotKVCache(
            self.n_layers,
            self.max_slots,
            self.max_len,
            self.n_kv,
            self.head_dim,
            self.dtype,
            self.device,
            shared_prefix=self.shared_prefix,
        )
        self._copy_format = CopyFormat(
            dtype=self.dtype,
            device=self.device,
            linear=self.linear,
            batch_hint=self.max_slots,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv,
            head_dim=self.head_dim,
            qk_norm=self.qk_norm,
        )
        self._sources = SourceParameters()
        self.sync_weights()

    @staticmethod
    def _check_config(cfg) -> None:
        mt = getattr(cfg, "model_type", None)
        if mt not in SUPPORTED_MODEL_TYPES:
            raise NotImplementedError(f"FastRunner supports {SUPPORTED_MODEL_TYPES}, not model_type={mt!r}")
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(
                f"FastRunner implements only the 'default' RoPE; this model uses rope_type={rope_type!r}"
            )
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise NotImplementedError("FastRunner does not implement partial rotary embeddings")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"FastRunner implements the SiLU MLP only, not {cfg.hidden_act!r}")
        layer_types = getattr(cfg, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            raise NotImplementedError("FastRunner does not implement sliding-window attention layers")

    def _rope_table(self, hf: torch.nn.Module, cfg) -> torch.Tensor:
        """(max_len, hd/2) complex64: the unit rotation of each position and frequency. The q/k rows
        are permuted at refresh (fast_weights.rope_pair_order) so that RoPE's pairs (d, d + hd/2)
        are adjacent: rotating them is one complex multiply."""
        inv_freq = getattr(getattr(hf.model, "rotary_emb", None), "inv_freq", None)
        if inv_freq is None:
            base = cfg.rope_parameters["rope_theta"]
            inv_freq = 1.0 / (base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))
        pos = torch.arange(self.max_len, dtype=torch.float32, device=self.device)
        freqs = pos[:, None] * inv_freq.to(device=self.device, dtype=torch.float32)[None, :]  # (max_len, hd/2)
        return torch.polar(torch.ones_like(freqs), freqs)

    # ------------------------------------------------------------------ weights

    def sync_weights(self) -> None:
        """`Runner.sync_weights`: rebuild the fused/cast/LoRA-merged weight copies from the
        model's current parameters. Call after every optimizer step, checkpoint load, or adapter
        switch (the backend does, and counts the version: rollout/backend.py). The KV caches of
        live slots are kept (they were computed with the old weights)."""
        self.weights, self._sources = build_decode_weights(self.model, self._copy_format)

    def is_stale(self) -> bool:
        """True when a source parameter changed in place (or was replaced) since sync_weights()."""
        return self._sources.changed()

    # ------------------------------------------------------------------ slots

    def alloc(self) -> int:
        return self.cache.alloc()

    def free(self, slot: int) -> None:
        self.cache.free(slot)

    def fork(self, source: int, target: int, length: int) -> None:
        """Copy the first `length` cached positions of `source` into the empty slot `target`."""
        self.cache.fork(source, target, length)

    def length(self, slot: int) -> int:
        return self.cache.length(slot)

    # ------------------------------------------------------------------ forward

    @torch.no_grad()  # not inference_mode: the returned logits may be used next to autograd tensors
    def forward(self, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        self._check_call(slots, chunks)
        decoding = [i for i, chunk in enumerate(chunks) if len(chunk) == 1]
        padding = len(decoding) * (max(len(chunk) for chunk in chunks) - 1)  # 0 unless one-token and longer chunks mix
        if not self.split_mixed or padding < sum(map(len, chunks)):
            return self._forward(slots, chunks)
        self.split_calls += 1  # "Mixed calls" in the module docstring
        longer = [i for i, chunk in enumerate(chunks) if len(chunk) > 1]
        parts = [self._forward([slots[i] for i in part], [chunks[i] for i in part]) for part in (decoding, longer)]
        logits = parts[0].new_empty(len(slots), parts[0].shape[1])  # (n, V), in the caller's order
        logits[decoding], logits[longer] = parts
        return logits

    def _forward(self, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """One packed call over every named slot (checked by `forward`): the (n, V) float32 logits."""
        lengths = self.cache.lengths
        packed = pack_chunks(slots, chunks, lengths, self.device)
        self.cache.ensure_zeroed(packed.rows, packed.key_end)
        # keys [0, P) are a prefix every named slot shares: attended once for all queries (P > 0)
        shared_len = self.cache.shared_prefix_length(packed.sorted_slots)
        mask = attention_mask(packed, shared_len, self.group, self.dtype, self.device)
        if shared_len:
            self.shared_prefix_calls += 1
        rope = self._rope.index_select(0, packed.token_positions)[:, None, :]  # (T, 1, hd/2) complex64
        x = self.weights.embed.index_select(0, packed.token_ids)  # (T, H), a new tensor: updated in place below
        self._decoder_layers(x, packed, rope, mask, shared_len)
        last = F.rms_norm(x.index_select(0, packed.last_tokens), (self.hidden,), self.weights.final_norm, self.eps)
        logits = self._project(last, self.weights.lm_head, self.weights.lm_head_bias)  # (n, V)
        for s, c in zip(slots, chunks):
            lengths[s] += len(c)  # type: ignore[operator]
        return logits.float()

    def _check_call(self, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> None:
        """Reject a call before it touches anything: a failed call changes no cache."""
        n = len(slots)
        if n == 0 or n != len(chunks):
            raise ValueError("forward needs one non-empty chunk per slot")
        if len(set(slots)) != n:
            raise ValueError(f"duplicate slots in {list(slots)}")
        lengths = self.cache.lengths
        for s, c in zip(slots, chunks):
            self.cache.check_slot(s)
            if len(c) == 0:
                raise ValueError(f"empty chunk for slot {s}")
            if lengths[s] + len(c) > self.max_len:  # type: ignore[operator]
                raise ValueError(f"slot {s}: {lengths[s]} cached + {len(c)} new tokens exceed max_len={self.max_len}")
        if self.check_weights and self.is_stale():
            raise RuntimeError(
                "model parameters changed since the last sync_weights(); call runner.sync_weights() "
                "after each optimizer step (or pass check_weights=False)"
            )

    def _decoder_layers(
        self, x: torch.Tensor, packed: PackedChunks, rope: torch.Tensor, mask: torch.Tensor, shared_len: int
    ) -> None:
        """Run every decoder layer on the (T, H) residual stream `x`, in place; write each layer's
        K/V of the packed tokens into the cache."""
        T, H, I = packed.num_tokens, self.hidden, self.intermediate
        nh, nkv, hd, g = self.n_heads, self.n_kv, self.head_dim, self.group
        n_q, n_qk = nh * hd, (nh + nkv) * hd
        eps, scale = self.eps, self.scale
        rope_in_compute_dtype = self.dtype == torch.float32  # the complex multiply needs fp32 pairs
        first, last = packed.first_row, packed.last_row
        key_start, key_end = shared_len, packed.key_end
        project, project_add = self._project, self._project_add
        to_tokens = functools.partial(packed.to_tokens, n_kv=nkv, group=g)
        for li, layer in enumerate(self.weights.layers):
            h = F.rms_norm(x, (H,), None, eps)
            qkv = project(h, layer.qkv_proj, layer.qkv_bias)  # (T, (nh + 2·nkv)·hd)
            qk = qkv[:, :n_qk].view(T, nh + nkv, hd)
            if layer.qk_norm is not None:
                torch.mul(F.rms_norm(qk, (hd,), None, eps), layer.qk_norm, out=qk)
            if rope_in_compute_dtype:
                torch.view_as_complex(qk.view(T, nh + nkv, hd // 2, 2)).mul_(rope)
            else:
                qk_fp32 = qk.float()
                torch.view_as_complex(qk_fp32.view(T, nh + nkv, hd // 2, 2)).mul_(rope)
                qk.copy_(qk_fp32)
            cache = self.cache.layers[li]  # (slots, 2, nkv, max_len, hd)
            cache[packed.token_slots, :, :, packed.token_positions] = qkv[:, n_q:].view(T, 2, nkv, hd)
            if packed.rows_are_range:
                k, v = self.cache.layer_keys_values[li]
                k, v = k[first : last + 1, :, key_start:key_end], v[first : last + 1, :, key_start:key_end]
            else:
                kv = cache[packed.gathered_rows, :, :, key_start:key_end]
                k, v = kv[:, 0], kv[:, 1]  # (B, nkv, Lk - P, hd)
            q = qkv[:, :n_q]  # (T, nh·hd)
            grid_queries = packed.to_grid(q, nkv, g, hd)  # (B, nkv, g·Lq, hd)
            if shared_len:
                prefix_k, prefix_v = self.cache.prefix_store.layer_keys_values[li]  # type: ignore[union-attr]
                prefix_k, prefix_v = prefix_k[:, :shared_len], prefix_v[:, :shared_len]  # (nkv, P, hd)
                attn = attend_with_shared_prefix(q, grid_queries, k, v, mask, prefix_k, prefix_v, scale, to_tokens)
            else:
                attn = F.scaled_dot_product_attention(grid_queries, k, v, attn_mask=mask, scale=scale)
                attn = to_tokens(attn).reshape(T, n_q)  # (T, nh·hd)
            project_add(x, attn, layer.o_proj, layer.o_bias)
            h = F.rms_norm(x, (H,), None, eps)
            gate_up = project(h, layer.gate_up_proj, layer.gate_up_bias)  # (T, 2·I)
            gate = gate_up[:, :I]
            F.silu(gate, inplace=True)
            gate.mul_(gate_up[:, I:])
            project_add(x, gate, layer.down_proj, layer.down_bias)
