"""Where bf16 pays: the "auto" precision of rollouts (`rollout.dtype`) and training
(`train.mixed_precision`).

bf16 halves the bytes a decode step reads, and on CPUs whose oneDNN has bf16 kernels (AVX512,
AMX, ARM with bf16) it made rollouts ~1.6x faster. Elsewhere torch runs a bf16 matmul through a
scalar fallback: on a 2-core AVX2 EPYC (no AVX512) a 512x576 @ 576x1536 matmul took 0.80 s in
bf16 against 0.013 s in fp32, 60x slower, and one bf16-autocast SFT step of SmolLM2-135M ran for
minutes. So "auto" means bf16 only where it is fast:

    resolve_rollout_dtype("auto")        # "bfloat16" where bf16_is_fast(), else "float32"
    resolve_mixed_precision("auto")      # "bf16" on such a CPU or a bf16 GPU, else "no"

An explicit "bfloat16" / "bf16" is kept, with a warning where it is slow. The result of a run
depends on the precision it ran in, so each run logs the one it resolved to.
"""

from __future__ import annotations

import functools
import warnings

import torch

SLOW_BF16 = (
    "bf16 matmuls on this CPU run through torch's scalar fallback (its oneDNN has no bf16 "
    "linear: no AVX512, AMX or ARM bf16), measured 60x slower than float32 on an AVX2 CPU"
)


@functools.cache
def mkldnn_linear_works(dtype: torch.dtype) -> bool:
    """Whether this torch build runs a oneDNN linear on prepacked weights in `dtype` (CPU).

    Probed once on an 8x8 weight: False wherever oneDNN is missing or lacks the kernel (bf16 on
    AVX2-only x86 CPUs, some non-x86 ones), so callers fall back instead of failing mid-run.
    """
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.eye(8, dtype=dtype), 1)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 8, dtype=dtype), w, None, "none", [], "")
        return bool(torch.equal(out.float(), torch.ones(1, 8)))
    except Exception:  # noqa: BLE001 - any failure means: no oneDNN kernel for this dtype
        return False


def bf16_is_fast(device: torch.device | str | None = None) -> bool:
    """bf16 compute is at least as fast as fp32 on `device` (default: the GPU if any, else the
    CPU): a CUDA device with bf16 support, or a CPU whose oneDNN runs bf16 linears."""
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and mkldnn_linear_works(torch.bfloat16)


def resolve_rollout_dtype(dtype: str, device: torch.device | str | None = None) -> str:
    """`rollout.dtype` as the decode runs it: "auto" becomes "bfloat16" or "float32" (module docstring)."""
    if dtype == "auto":
        return "bfloat16" if bf16_is_fast(device) else "float32"
    if dtype == "bfloat16" and not bf16_is_fast(device):
        warnings.warn(f"rollout.dtype=bfloat16: {SLOW_BF16}; use auto or float32", stacklevel=2)
    return dtype


def decoded_dtype(dtype: str, device: torch.device | str | None = None) -> str:
    """The precision `rollout.dtype` decodes in, for records and checks: "auto" resolved, any other
    value as it is (no warning: `resolve_rollout_dtype`, which the decode itself calls, gives it)."""
    return resolve_rollout_dtype(dtype, device) if dtype == "auto" else dtype


def resolve_mixed_precision(mixed_precision: str) -> str:
    """`train.mixed_precision` as accelerate gets it: "auto" becomes "bf16" or "no"."""
    if mixed_precision == "auto":
        return "bf16" if bf16_is_fast() else "no"
    if mixed_precision == "bf16" and not bf16_is_fast():
        warnings.warn(f"train.mixed_precision=bf16: {SLOW_BF16}; use auto or no", stacklevel=2)
    return mixed_precision
