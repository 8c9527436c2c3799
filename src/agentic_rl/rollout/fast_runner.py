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
    runner.refresh_weights()                                       # REQUIRED after every update

Weights contract
----------------
The runner computes from *copies* of most projection weights: q/k/v fused into one matrix,
gate/up fused into one matrix, the RMSNorm scales folded into the following projection, the
q/k rows permuted for RoPE-as-complex-multiply, transposed (`weight_layout="t"`) or reordered for oneDNN,
cast in bf16 mode, and LoRA deltas merged. So the runner does not see weight updates by itself:
**call `refresh_weights()` after every optimizer step** (and after loading a checkpoint or
switching/enabling/disabling LoRA adapters: the adapter state is captured at refresh time).
`refresh_weights()` returns a counter, `weights_version`, that the engine can stamp on
trajectories.

Staleness is detected on a best-effort basis: the runner records each source parameter's
identity, storage pointer and autograd version counter; every in-place update through the
parameter itself (optimizer steps, `load_state_dict`, `copy_`) bumps it. `is_stale()` reports
it, and with `check_weights=True` (the default) `forward` raises instead of decoding with stale
weights. Writes through `param.data` bypass the version counter and are not detected.

LoRA (peft): adapted `nn.Linear` layers (peft `lora.Linear`) are merged into the copies:
W + sum over active adapters of (alpha/r)·B·A (peft's own `get_delta_weight`), dropout ignored.
LoRA variants (DoRA, ...) and LoRA on embeddings raise NotImplementedError.

KV cache
--------
One preallocated tensor (layers, max_slots, 2, kv_heads, max_len, head_dim) in the compute
dtype: about `2·layers·kv_heads·head_dim·bytes` per token per slot (46 KB for SmolLM2-135M
fp32, so 32 slots × 2048 tokens = 3 GB). It is allocated with `torch.empty` and zeroed lazily in
blocks as rows grow, so on CPU untouched memory is never committed. A slot's id is its cache
row. The rows named in one call are attended as a range view of the cache when the sorted slot
ids span at most 2·n rows (rows in the range that are not named are computed as masked dummies
and discarded), else they are gathered (a copy per layer). `alloc` hands out the lowest free id,
which keeps decoding sets compact.

Performance (CPU, 2 cores): decoding small models is bound by per-op overhead and weight
reads. The weight reads are fixed by the precision (fp32 SmolLM2-135M streams ~540 MB per step,
so on a machine whose memory bandwidth is shared this floor dominates and the speed-up over
`generate` shrinks); what is left to cut is the op count. Each layer is ~11 compute ops
(about half of transformers' per-step aten calls): rms_norm, one fused QKV matmul, one in-place complex multiply
for RoPE on q and k together, one index_put of k and v into the cache, one SDPA call (GQA via a
reshape: the g query heads of a KV head become g query rows, no KV repeat), one addmm for o_proj
fused with the residual, rms_norm, one fused gate/up matmul, in-place silu and multiply, and one
addmm for down_proj fused with the residual. The LM head runs on the last token of each chunk.

Shared-prefix attention (`shared_prefix=`): the engine prefills the prompt prefix its episodes
share (system prompt, tool schemas: ~380 of ~430 arith prompt tokens) once and `fork`s it into
every slot, so each decode step would read those K/V rows once per slot. Instead, `fork` also keeps
one copy of the forked prefix (the store; each slot keeps its own copy too, so nothing depends on
the store staying put), and a call whose named slots all share the store's first k0 >= `shared_prefix`
tokens runs attention in two parts: every query of every row against the k0 prefix keys in one
call (T·g query rows per KV head instead of g), and each row's queries against its own keys
[k0, len). The CPU flash kernel returns each part's log-sum-exp, and the exact softmax over the
union is their mix o_row + (o_pre − o_row)·σ(lse_pre − lse_row). A later fork from a slot whose
cache starts with the store's K/V joins it (episodes admitted while others run); a fork of
another prefix replaces the store. Calls that mix slots of different prefixes (or unforked
slots) attend each row's whole cache, as before.

Projections (`linear=`): on a CPU with oneDNN the default reorders every projection weight once
per `refresh_weights()` into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`,
the kernel inductor uses for frozen CPU linears) and runs `mkldnn._linear_pointwise` on it. The
copies are opaque tensors (no `data_ptr`), the tied LM head included. Same arithmetic, no repacking
per call: `benchmarks/decode_probe.py --linears mm mkldnn` measured batch-8 decoding 1.20x faster
in bf16 and 1.24x in fp32, and batch 32 1.08x and 0.98x (BENCHMARKS.md). Reordering all
SmolLM2-135M projections takes about 0.06 s per refresh.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from agentic_rl.rollout.fast_kv_cache import SlotKVCache
from agentic_rl.rollout.fast_weights import (
    PROJECTIONS,
    CopyFormat,
    SourceParameters,
    build_decode_weights,
    choose_linear,
    unwrap,
)
from agentic_rl.rollout.runner import Runner

SUPPORTED_MODEL_TYPES = ("llama", "qwen3")
# the CPU flash kernel that also returns each query's log-sum-exp (shared-prefix attention merges on it)
_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class FastRunner(Runner):
    """A lean Llama/Qwen3 forward over a preallocated slot KV cache. See the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_slots: int = 32,
        max_len: int = 2048,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        weight_layout: str = "auto",
        check_weights: bool = True,
        linear: str = "auto",
        shared_prefix: int = 64,
    ) -> None:
        """`model`: a LlamaForCausalLM / Qwen3ForCausalLM, optionally peft-wrapped.
        `dtype`: compute dtype, default the model's own when it is fp32 or bf16 (else fp32);
        bf16 copies of an fp32 model are a separate, approximate mode. Logits
        are always returned as float32. `device`: default the model's.
        `weight_layout`: "t" stores (in, out) contiguous copies (fastest for fp32 on CPU),
        "n" uses the (out, in) layout of nn.Linear (and reuses unfused weights); "auto" = "n".
        `linear`: how projections run. "mm": torch.mm/addmm on the `weight_layout` copies.
        "mkldnn": oneDNN linears on weights reordered once per refresh into oneDNN's blocked
        layout (CPU only; `weight_layout` then does not apply). "auto": "mkldnn" on a CPU with
        oneDNN, else "mm".
        `shared_prefix`: attend a prefix that every slot of a call got from the same `fork` once
        per call for all of them, when it is at least this many tokens (CPU; 0 = never). See
        "Shared-prefix attention" in the module docstring.
        """
        if max_slots < 1 or max_len < 1:
            raise ValueError("max_slots and max_len must be positive")
        self.model = model
        hf = unwrap(model)
        cfg = hf.config
        self._check_config(cfg)
        self.max_slots = int(max_slots)
        self.max_len = int(max_len)
        first = next(hf.parameters())
        self.device = torch.device(device) if device is not None else first.device
        self.dtype = dtype or (first.dtype if first.dtype in (torch.float32, torch.bfloat16) else torch.float32)
        if weight_layout == "auto":
            # "t" wins only while the weights stay cache-resident (fp32 microbenchmarks at M=8);
            # with weights streamed from DRAM (the real decode case) the two layouts measure
            # alike, and "n" reuses o_proj/down_proj/lm_head without copies.
            weight_layout = "n"
        if weight_layout not in ("t", "n"):
            raise ValueError(f"weight_layout must be 'auto', 't' or 'n', got {weight_layout!r}")
        self.weight_layout = weight_layout
        self.check_weights = check_weights
        self.linear = choose_linear(linear, self.device, self.dtype)
        self._project, self._project_add = PROJECTIONS[self.linear]
        if shared_prefix < 0:
            raise ValueError(f"shared_prefix must be >= 0 tokens (0 = off), got {shared_prefix}")
        self.shared_prefix = int(shared_prefix) if self.device.type == "cpu" else 0  # the merge needs the CPU kernel's LSE
        self.shared_prefix_calls = 0
        """forward calls that attended a shared prefix once for all their slots (for tests and benchmarks)."""

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

        # RoPE as a complex multiply on (d, d + hd/2) pairs made adjacent by a row permutation
        # (fast_weights.rope_pair_order).
        inv_freq = getattr(getattr(hf.model, "rotary_emb", None), "inv_freq", None)
        if inv_freq is None:
            base = cfg.rope_parameters["rope_theta"]
            inv_freq = 1.0 / (base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))
        pos = torch.arange(self.max_len, dtype=torch.float32, device=self.device)
        freqs = pos[:, None] * inv_freq.to(device=self.device, dtype=torch.float32)[None, :]
        self._rope = torch.polar(torch.ones_like(freqs), freqs)  # (max_len, hd/2) complex64

        self.cache = SlotKVCache(
            self.n_layers, self.max_slots, self.max_len, self.n_kv, self.head_dim, self.dtype, self.device,
            shared_prefix=self.shared_prefix,
        )
        self._copy_format = CopyFormat(
            dtype=self.dtype,
            device=self.device,
            linear=self.linear,
            weight_layout=self.weight_layout,
            batch_hint=self.max_slots,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv,
            head_dim=self.head_dim,
            qk_norm=self.qk_norm,
        )
        self.weights_version = 0
        self._sources = SourceParameters()
        self.refresh_weights()

    # ------------------------------------------------------------------ configuration

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

    # ------------------------------------------------------------------ weights

    def refresh_weights(self) -> int:
        """Rebuild the fused/cast/LoRA-merged weight copies from the model's current parameters.

        Call after every optimizer step, checkpoint load, or adapter switch. The KV caches of
        live slots are kept (they were computed with the old weights). Returns the new
        `weights_version`.
        """
        self.weights, self._sources = build_decode_weights(self.model, self._copy_format)
        self.weights_version += 1
        return self.weights_version

    def is_stale(self) -> bool:
        """True when a source parameter changed in place (or was replaced) since refresh_weights()."""
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
                raise ValueError(
                    f"slot {s}: {lengths[s]} cached + {len(c)} new tokens exceed max_len={self.max_len}"
                )
        if self.check_weights and self.is_stale():
            raise RuntimeError(
                "model parameters changed since the last refresh_weights(); call runner.refresh_weights() "
                "after each optimizer step (or pass check_weights=False)"
            )

        order = sorted(range(n), key=slots.__getitem__)
        ss = [slots[i] for i in order]
        lo, hi = ss[0], ss[-1]
        span = hi - lo + 1
        cover = span <= 2 * n
        rows = list(range(lo, hi + 1)) if cover else ss
        B = len(rows)
        row_of = {s: (s - lo if cover else b) for b, s in enumerate(ss)}
        lq = max(len(c) for c in chunks)
        starts = [0] * B
        qlens = [0] * B
        ids: list[int] = []
        slot_t: list[int] = []
        pos_t: list[int] = []
        qrow_t: list[int] = []
        offset: dict[int, int] = {}
        lk = 1
        chunk_of = dict(zip(slots, chunks))
        for s in ss:  # tokens are packed in slot order; `last` maps back to the caller's order
            c = chunk_of[s]
            L = len(c)
            st = lengths[s]
            b = row_of[s]
            starts[b], qlens[b] = st, L
            offset[s] = len(ids)
            ids.extend(int(t) for t in c)
            slot_t.extend([s] * L)
            pos_t.extend(range(st, st + L))
            qrow_t.extend(range(b * lq, b * lq + L))
            lk = max(lk, st + L)  # type: ignore[operator]
        T = len(ids)
        last = [offset[s] + len(chunk_of[s]) - 1 for s in slots]
        packed = torch.tensor(ids + slot_t + pos_t + qrow_t + last + starts + qlens, dtype=torch.long)
        packed = packed.to(self.device, non_blocking=True)
        ids_d, slot_d, pos_d, qrow_d = packed[:T], packed[T : 2 * T], packed[2 * T : 3 * T], packed[3 * T : 4 * T]
        last_d = packed[4 * T : 4 * T + n]
        starts_d = packed[4 * T + n : 4 * T + n + B]
        qlens_d = packed[4 * T + n + B :]

        self.cache.ensure_zeroed(rows, lk)

        # Keys [0, k0) are a prefix every named slot shares: attended once for all queries (k0 > 0).
        # The per-row attention covers keys [k0, lk) under the mask (B, 1, lq or g*lq, lk - k0): key j
        # is visible to query (b, i) iff j <= start_b + i; padding / dummy queries see key k0 only
        # (their outputs are discarded)
        k0 = self.cache.shared_prefix_length(ss)
        g = self.group
        ar_q = torch.arange(lq, device=self.device)
        keys = torch.arange(k0, lk, device=self.device)
        qpos = starts_d[:, None] + ar_q[None, :]  # (B, lq)
        mask = keys[None, None, :] <= qpos[:, :, None]  # (B, lq, lk - k0)
        fast = lq == 1 and B == n  # plain batched decode over a contiguous range of slots
        exact = B == n and T == B * lq
        if not exact:
            invalid = ar_q[None, :] >= qlens_d[:, None]
            mask = torch.where(invalid[:, :, None], keys[None, None, :] == k0, mask)
        if lq == 1:
            mask = mask[:, None]  # (B, 1, 1, lk - k0), broadcast over the g query rows of a KV head
        else:
            mask = mask[:, None, None].expand(B, 1, g, lq, lk - k0).reshape(B, 1, g * lq, lk - k0)
        if k0:
            self.shared_prefix_calls += 1
            # the kernel that returns log-sum-exps takes an additive mask in the compute dtype
            mask = torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill_(~mask, float("-inf"))

        def to_tokens(t: torch.Tensor) -> torch.Tensor:
            """(B, nkv, g·lq, *rest) per-row attention results -> (T, nkv, g, *rest) in packed token order."""
            rest = t.shape[3:]
            if fast:
                return t.view(B, self.n_kv, g, *rest)
            t = t.view(B, self.n_kv, g, lq, *rest).movedim(3, 1).reshape(B * lq, self.n_kv, g, *rest)
            return t if exact else t.index_select(0, qrow_d)

        fc = self._rope.index_select(0, pos_d)[:, None, :]  # (T, 1, hd/2) complex64
        x = self.weights.embed.index_select(0, ids_d)  # (T, H), a new tensor: updated in place below
        rows_d = None if cover else torch.tensor(rows, device=self.device)
        H, nh, nkv, hd, I = self.hidden, self.n_heads, self.n_kv, self.head_dim, self.intermediate
        nq, nqk = nh * hd, (nh + nkv) * hd
        eps, scale = self.eps, self.scale
        complex_ok = self.dtype == torch.float32
        caches, kviews = self.cache.layers, self.cache.layer_keys_values
        proj, proj_add = self._project, self._project_add
        for li, lw in enumerate(self.weights.layers):
            h = F.rms_norm(x, (H,), None, eps)
            qkv = proj(h, lw.qkv_proj, lw.qkv_bias)
            qk = qkv[:, :nqk].view(T, nh + nkv, hd)
            if lw.qk_norm is not None:
                torch.mul(F.rms_norm(qk, (hd,), None, eps), lw.qk_norm, out=qk)
            if complex_ok:
                torch.view_as_complex(qk.view(T, nh + nkv, hd // 2, 2)).mul_(fc)
            else:
                qkf = qk.float()
                torch.view_as_complex(qkf.view(T, nh + nkv, hd // 2, 2)).mul_(fc)
                qk.copy_(qkf)
            cache = caches[li]
            cache[slot_d, :, :, pos_d] = qkv[:, nq:].view(T, 2, nkv, hd)
            if cover:
                k, v = kviews[li]
                k, v = k[lo : hi + 1, :, k0:lk], v[lo : hi + 1, :, k0:lk]
            else:
                kv = cache[rows_d, :, :, k0:lk]
                k, v = kv[:, 0], kv[:, 1]
            q = qkv[:, :nq]
            if fast:
                qq = q.view(B, nkv, g, hd)
            else:
                qp = q if exact else q.new_zeros(B * lq, nq).index_copy_(0, qrow_d, q)
                qq = qp.view(B, lq, nkv, g, hd).permute(0, 2, 3, 1, 4).reshape(B, nkv, g * lq, hd)
            if k0:
                a = self._attend_with_shared_prefix(li, k0, q, qq, k, v, mask, to_tokens)
            else:
                a = to_tokens(F.scaled_dot_product_attention(qq, k, v, attn_mask=mask, scale=scale)).reshape(T, nq)
            proj_add(x, a, lw.o_proj, lw.o_bias)
            h = F.rms_norm(x, (H,), None, eps)
            gu = proj(h, lw.gate_up_proj, lw.gate_up_bias)
            gate = gu[:, :I]
            F.silu(gate, inplace=True)
            gate.mul_(gu[:, I:])
            proj_add(x, gate, lw.down_proj, lw.down_bias)

        xl = F.rms_norm(x.index_select(0, last_d), (H,), self.weights.final_norm, eps)
        logits = proj(xl, self.weights.lm_head, self.weights.lm_head_bias)
        for s, c in zip(slots, chunks):
            lengths[s] += len(c)  # type: ignore[operator]
        return logits.float()

    def _attend_with_shared_prefix(self, li, k0, q, qq, k, v, mask, to_tokens) -> torch.Tensor:
        """Attention output (T, nh·hd) of the packed queries `q` over a shared prefix plus each row's keys.

        The prefix keys [0, k0) are the same for every row, so all T·g queries of a KV head
        attend them in one call; each row's queries `qq` (B, nkv, g·lq, hd) attend its own keys
        [k0, lk) (`k`, `v` under `mask`). Softmax over the union is the two partial outputs
        weighted by their shares of the total mass: o = o_row + (o_pre − o_row)·σ(lse_pre − lse_row).
        `to_tokens` maps per-row results to packed token order (see forward).
        """
        T, (nkv, g, hd) = q.shape[0], (self.n_kv, self.group, self.head_dim)
        flash = _FLASH_CPU
        pk, pv = self.cache.prefix_store.layer_keys_values[li]  # type: ignore[union-attr]
        pk, pv = pk[:, :k0], pv[:, :k0]  # (nkv, k0, hd)
        qs = q.view(T, nkv, g, hd).transpose(0, 1).reshape(1, nkv, T * g, hd)
        o_pre, lse_pre = flash(qs, pk[None], pv[None], 0.0, False, scale=self.scale)
        o_pre = o_pre.view(nkv, T, g, hd).transpose(0, 1)  # (T, nkv, g, hd)
        lse_pre = lse_pre.view(nkv, T, g).transpose(0, 1)
        o_row, lse_row = flash(qq, k, v, 0.0, False, attn_mask=mask, scale=self.scale)
        o_row, lse_row = to_tokens(o_row), to_tokens(lse_row)
        share = torch.sigmoid(lse_pre - lse_row).unsqueeze(-1)  # float32
        if self.dtype != torch.float32:
            o_pre, o_row = o_pre.float(), o_row.float()
        return torch.lerp(o_row, o_pre, share).to(self.dtype).reshape(T, nkv * g * hd)
