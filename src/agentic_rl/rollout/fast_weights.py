"""FastRunner's weights: fused, folded, cast, LoRA-merged copies of a model, and how to tell they are stale.

What. `build_decode_weights(model, fmt)` reads a Llama/Qwen3 model (optionally
peft-wrapped) and returns `DecodeWeights`: per layer one q/k/v matrix, one gate/up matrix, the
o_proj and down_proj matrices, each in the form the decode loop multiplies by. The copies are:

- fused: q, k and v rows stacked into one matrix, gate and up into another, so a layer runs two
  wide projections where the model runs five narrow ones;
- folded: each RMSNorm scale multiplied into the columns of the projection that follows it, so
  the loop normalises without a scale (`rms_norm(x, weight=None)`);
- permuted: the q/k rows of each head reordered so that RoPE's pairs (d, d + hd/2) sit side by
  side, which turns the rotation into one in-place complex multiply (see `rope_pair_order`);
- cast to the compute dtype, and laid out for the projection backend: torch.mm's right-hand
  operand ("mm"), or reordered once into oneDNN's blocked layout ("mkldnn");
- LoRA-merged: W + Σ over active adapters of (alpha/r)·B·A, computed by peft's own
  `get_delta_weight` (dropout does not apply at inference).

Tensors that need no change are used as they are, not copied: the embedding and the final norm
when they already have the compute dtype and device, and under "mm" a plain LM head (tied or not),
multiplied as the transposed (out, in) view of nn.Linear's own weight.

Why copies. Fewer, wider ops per layer: on CPU, decoding a small model is bound by weight reads
and per-op dispatch, not arithmetic (BENCHMARKS.md, "Where a decode step goes").

Projection backends (`PROJECTIONS`). "mm" runs torch.mm/addmm on plain copies. "mkldnn" reorders
every projection weight once per build into oneDNN's blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, the kernel inductor uses for frozen CPU linears) and
runs `mkldnn._linear_pointwise` on it: the same arithmetic, without repacking the weight on every
call. Those copies are opaque tensors (no `data_ptr`), the tied LM head included. The A/B of the
two backends is in BENCHMARKS.md ("Decode probe").

The invariant this costs, and how it is kept. The copies do not follow the model: after an
optimizer step, a checkpoint load or any change of the LoRA adapters (switched, enabled,
disabled: their state is captured at build time) the copies must be rebuilt. `SourceParameters`
records every parameter a build read, with its storage pointer and autograd version counter;
any in-place update through the parameter (optimizer steps, `load_state_dict`, `copy_`) bumps
the counter, and a replaced tensor changes the pointer, so `changed()` reports it. Writes
through `param.data` bypass the counter and are not detected.

Not supported (raises NotImplementedError): LoRA variants (DoRA, ...), LoRA biases, LoRA on
embeddings, and projections that are not `nn.Linear`.

Shape legend: H hidden size, I MLP intermediate size, V vocabulary, nh query heads, nkv
key/value heads, hd head dim, Nqkv = (nh + 2·nkv)·hd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft.tuners.lora import LoraLayer

from agentic_rl.models.backbone import unwrap_causal_lm
from agentic_rl.models.precision import mkldnn_linear_works

Projection = tuple[torch.Tensor, torch.Tensor | None]  # (weight operand, bias or None)


@dataclass
class LayerWeights:
    """One decoder layer as the decode loop consumes it. Each `*_proj` is an operand for the
    projection backend (see `PROJECTIONS`), mapping (T, in) activations to (T, out)."""

    qkv_proj: torch.Tensor  # (H -> Nqkv), input RMSNorm folded in, q/k rows rope-permuted
    qkv_bias: torch.Tensor | None  # (Nqkv,)
    qk_norm: torch.Tensor | None  # Qwen3: (nh + nkv, hd) q_norm/k_norm scales (rope-permuted); Llama: None
    o_proj: torch.Tensor  # (nh·hd -> H)
    o_bias: torch.Tensor | None
    gate_up_proj: torch.Tensor  # (H -> 2·I), post-attention RMSNorm folded in
    gate_up_bias: torch.Tensor | None
    down_proj: torch.Tensor  # (I -> H)
    down_bias: torch.Tensor | None


@dataclass
class DecodeWeights:
    embed: torch.Tensor  # (V, H), the embedding itself when it has the compute dtype and device
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # (H,)
    lm_head: torch.Tensor  # (H -> V) operand
    lm_head_bias: torch.Tensor | None


@dataclass(frozen=True)
class CopyFormat:
    """What `build_decode_weights` needs to know besides the model: the runner's settings."""

    dtype: torch.dtype
    device: torch.device
    linear: str  # projection backend: "mm" or "mkldnn"
    batch_hint: int  # rows a projection typically sees (the runner's max_slots): oneDNN blocks for it
    n_heads: int
    n_kv_heads: int
    head_dim: int
    qk_norm: bool  # Qwen3's per-head q_norm/k_norm


# ---------------------------------------------------------------------- projection backends
# project(h, w, b) -> h·w + b;  project_add(x, h, w, b): x += h·w + b in place (the residual add).


def mm_project(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.mm(h, w) if b is None else torch.addmm(b, h, w)


def mm_project_add(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    x.addmm_(h, w)
    if b is not None:
        x.add_(b)


def mkldnn_project(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(h, w, b, "none", [], "")


def mkldnn_project_add(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    x.add_(torch.ops.mkldnn._linear_pointwise(h, w, b, "none", [], ""))


PROJECTIONS = {"mm": (mm_project, mm_project_add), "mkldnn": (mkldnn_project, mkldnn_project_add)}


def choose_linear(linear: str, device: torch.device, dtype: torch.dtype) -> str:
    """The projection backend for FastRunner's `linear=` setting ("auto", "mm" or "mkldnn")."""
    if linear == "auto":
        # prepacked weights: faster or equal at every measured batch and dtype (BENCHMARKS.md)
        mkldnn_ok = device.type == "cpu" and mkldnn_linear_works(dtype)
        linear = "mkldnn" if mkldnn_ok else "mm"
    if linear not in ("mm", "mkldnn"):
        raise ValueError(f"linear must be 'auto', 'mm' or 'mkldnn', got {linear!r}")
    if linear == "mkldnn" and not (device.type == "cpu" and mkldnn_linear_works(dtype)):
        raise ValueError(
            f"linear='mkldnn' needs a CPU device whose oneDNN runs {dtype} linears; this runner is on "
            f"{device}: use linear='mm'"
        )
    return linear


# ---------------------------------------------------------------------- staleness


class SourceParameters:
    """The parameters one build read, each with its storage pointer and autograd version then."""

    def __init__(self) -> None:
        self._seen: list[tuple[torch.Tensor, int, int]] = []

    def track(self, p: torch.Tensor) -> None:
        self._seen.append((p, p.data_ptr(), p._version))

    def read(self, p: torch.Tensor) -> torch.Tensor:
        self.track(p)
        return p.detach()

    def changed(self) -> bool:
        """True when a parameter changed in place (or was replaced) since it was read."""
        for p, ptr, version in self._seen:
            if p._version != version or p.data_ptr() != ptr:
                return True
        return False


# ---------------------------------------------------------------------- building the copies


def rope_pair_order(head_dim: int) -> torch.Tensor:
    """(hd,) row order that puts each RoPE pair (d, d + hd/2) side by side: 0, hd/2, 1, hd/2 + 1, ..."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).reshape(-1)


def build_decode_weights(model: torch.nn.Module, fmt: CopyFormat) -> tuple[DecodeWeights, SourceParameters]:
    """Build the copies from the model's current parameters; also return what they were read from."""
    builder = _Builder(fmt)
    with torch.no_grad():
        weights = builder.build(unwrap_causal_lm(model))
    return weights, builder.sources


class _Builder:
    """One build: the copy format and the parameters read so far."""

    def __init__(self, fmt: CopyFormat) -> None:
        self.fmt = fmt
        self.sources = SourceParameters()
        self.pair_order = rope_pair_order(fmt.head_dim).to(fmt.device)

    def build(self, hf: torch.nn.Module) -> DecodeWeights:
        embed = hf.model.embed_tokens
        if isinstance(embed, LoraLayer):
            raise NotImplementedError("FastRunner does not merge LoRA on embeddings")
        self.sources.track(embed.weight)
        embed_weight = self.as_is(embed.weight)
        layers = [self.layer(layer) for layer in hf.model.layers]
        final_norm = self.as_is(self.sources.read(hf.model.norm.weight))
        lm_head, lm_head_bias = self.lm_head(hf.lm_head)
        return DecodeWeights(embed_weight, layers, final_norm, lm_head, lm_head_bias)

    def layer(self, layer: torch.nn.Module) -> LayerWeights:
        fmt, order = self.fmt, self.pair_order
        nh, nkv, hd = fmt.n_heads, fmt.n_kv_heads, fmt.head_dim
        att, mlp = layer.self_attn, layer.mlp
        input_norm = self.sources.read(layer.input_layernorm.weight).float()  # (H,)
        post_norm = self.sources.read(layer.post_attention_layernorm.weight).float()  # (H,)
        wq, bq = self.effective_linear(att.q_proj)  # (nh·hd, H)
        wk, bk = self.effective_linear(att.k_proj)  # (nkv·hd, H)
        wv, bv = self.effective_linear(att.v_proj)
        wo, bo = self.effective_linear(att.o_proj)
        wg, bg = self.effective_linear(mlp.gate_proj)  # (I, H)
        wu, bu = self.effective_linear(mlp.up_proj)
        wd, bd = self.effective_linear(mlp.down_proj)  # (H, I)
        wq = wq.view(nh, hd, -1)[:, order].reshape(nh * hd, -1)
        wk = wk.view(nkv, hd, -1)[:, order].reshape(nkv * hd, -1)
        wqkv = torch.cat([wq, wk, wv], dim=0) * input_norm[None, :]  # (Nqkv, H)
        bqkv = None
        if bq is not None:
            bq = bq.view(nh, hd)[:, order].reshape(-1)
            bk = bk.view(nkv, hd)[:, order].reshape(-1)
            bqkv = self.cast(torch.cat([bq, bk, bv]))
        qk_norm = None
        if fmt.qk_norm:
            q_scale = self.sources.read(att.q_norm.weight).float()[order]  # (hd,)
            k_scale = self.sources.read(att.k_norm.weight).float()[order]
            qk_norm = self.cast(torch.cat([q_scale.expand(nh, hd), k_scale.expand(nkv, hd)])).contiguous()
        wgu = torch.cat([wg, wu], dim=0) * post_norm[None, :]  # (2·I, H)
        bgu = self.cast(torch.cat([bg, bu])) if bg is not None else None
        return LayerWeights(
            qkv_proj=self.operand(wqkv),
            qkv_bias=bqkv,
            qk_norm=qk_norm,
            o_proj=self.operand(wo),
            o_bias=None if bo is None else self.cast(bo),
            gate_up_proj=self.operand(wgu),
            gate_up_bias=bgu,
            down_proj=self.operand(wd),
            down_bias=None if bd is None else self.cast(bd),
        )

    def lm_head(self, head: torch.nn.Module) -> Projection:
        fmt = self.fmt
        head_is_lora = isinstance(head, LoraLayer)
        copy_head = head_is_lora or fmt.linear == "mkldnn"
        if copy_head or getattr(head, "bias", None) is not None:
            w, b = self.effective_linear(head)
            return self.operand(w), None if b is None else self.cast(b)
        self.sources.track(head.weight)
        return self.as_is(head.weight).t(), None  # tied or not: no copy needed

    def effective_linear(self, mod: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Effective (out, in) fp32 weight and bias of an nn.Linear or a peft lora.Linear."""
        if isinstance(mod, LoraLayer):
            return self.merged_lora(mod)
        if not isinstance(mod, torch.nn.Linear):
            raise NotImplementedError(f"FastRunner expects nn.Linear projections, got {type(mod).__name__}")
        w = self.sources.read(mod.weight).float()
        bias = None if mod.bias is None else self.sources.read(mod.bias).float()
        return w, bias

    def merged_lora(self, mod: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """W + sign · Σ_adapters (alpha/r)·B·A for a peft lora.Linear, as (out, in) fp32."""
        base = mod.get_base_layer()
        if not isinstance(base, torch.nn.Linear):
            raise NotImplementedError(f"FastRunner merges LoRA on nn.Linear only, not {type(base).__name__}")
        w = self.sources.read(base.weight).float().clone()
        bias = None if base.bias is None else self.sources.read(base.bias).float()
        merged = list(getattr(mod, "merged_adapters", []))
        if mod.disable_adapters:
            # base weight holds the merged adapters' deltas; peft unmerges them when disabled
            adapters, sign = merged, -1.0
        else:
            adapters = [a for a in mod.active_adapters if a in mod.lora_A and a not in merged]
            sign = 1.0
        for name in adapters:
            if name in getattr(mod, "lora_variant", {}) or getattr(mod, "use_dora", {}).get(name, False):
                raise NotImplementedError(f"FastRunner does not merge LoRA variants (adapter {name!r}, e.g. DoRA)")
            if getattr(mod, "lora_bias", {}).get(name, False):
                raise NotImplementedError("FastRunner does not merge LoRA biases")
            self.sources.track(mod.lora_A[name].weight)
            self.sources.track(mod.lora_B[name].weight)
            w.add_(mod.get_delta_weight(name).detach().float(), alpha=sign)
        return w, bias

    def cast(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.fmt.device, dtype=self.fmt.dtype)

    def as_is(self, p: torch.Tensor) -> torch.Tensor:
        """The parameter itself when it already has our dtype/device, else a cast copy."""
        p = p.detach()
        fmt = self.fmt
        return p if (p.dtype == fmt.dtype and p.device == fmt.device) else p.to(device=fmt.device, dtype=fmt.dtype)

    def operand(self, w: torch.Tensor) -> torch.Tensor:
        """(out, in) fp32 weight -> what the projection backend multiplies by: oneDNN-packed, or
        torch.mm's right-hand operand (in, out): the transposed view of a contiguous (out, in) copy
        (an (in, out) contiguous copy measured alike once weights stream from DRAM, BENCHMARKS.md)."""
        fmt = self.fmt
        w = self.cast(w)
        if fmt.linear == "mkldnn":
            return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), fmt.batch_hint)
        return w.contiguous().t()
