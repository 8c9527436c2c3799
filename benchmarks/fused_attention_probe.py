"""Probe: would a compiled decode-attention kernel beat FastRunner's shared-prefix attention path?

    .venv/bin/python benchmarks/fused_attention_probe.py [--batch 8] [--prefix 376] [--own 60] [--repeats 7]

Needs a C++ compiler and ninja (the kernel is built with torch.utils.cpp_extension.load_inline into
a temporary directory); it is a measurement for the decision whether the project should ship a
compiled extension, not part of the product.

Both sides compute the same thing for one decode step of SmolLM2-135M's attention shapes (3 KV
heads, 3 query heads per KV head, head_dim 64, fp32) over 30 layers' worth of K/V:
  * "torch": FastRunner's own `attend_with_shared_prefix` (fast_attention.py), called as a decode
    step calls it: one CPU flash-attention call with every row's queries against the prefix keys,
    one per-row call against each row's own keys under a padding mask, and the log-sum-exp merge
    (sigmoid, lerp).
  * "compiled": one C++ call: for each (KV head, row), in parallel over both cores, the scores of
    the row's query heads against the prefix and its own valid keys, a softmax, and the weighted
    sum of values; plain loops that the compiler vectorises (-O3 -march=native, `omp simd`).
The rows' own key counts are random in [--own / 2, --own]. The script checks that both sides agree
(max abs difference), then times 30-layer sweeps, interleaved, and reports µs per layer: median
(min-max) of --repeats and the ratio torch / compiled. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from agentic_rl.rollout.fast_attention import attend_with_shared_prefix

KERNEL = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// q (B, H, G, 64) contiguous; pk/pv (H, k0, 64) with any head stride; k/v (B, H, L, 64) strided
// views of a cache; nvalid[b] = keys of row b after the prefix. Returns (B, H, G, 64).
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor pk, torch::Tensor pv, torch::Tensor k,
                               torch::Tensor v, torch::Tensor nvalid, double scale) {
  const int64_t B = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), k0 = pk.size(1), L = k.size(2);
  TORCH_CHECK(D == 64 && G <= 8 && q.is_contiguous() && pk.stride(2) == 1 && k.stride(3) == 1);
  auto out = torch::empty_like(q);
  const float *qp = q.data_ptr<float>(), *pkp = pk.data_ptr<float>(), *pvp = pv.data_ptr<float>();
  const float *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const int64_t* nv = nvalid.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, H * B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(G * (k0 + L));
    float acc[8][64];
    for (int64_t item = begin; item < end; ++item) {  // KV-head-major: a thread reuses a head's prefix
      const int64_t h = item / B, b = item % B, n = k0 + nv[b];
      const float* qb = qp + (b * H + h) * G * D;
      const float* pkh = pkp + h * pk.stride(0);
      const float* pvh = pvp + h * pv.stride(0);
      const float* kb = kp + b * k.stride(0) + h * k.stride(1);
      const float* vb = vp + b * v.stride(0) + h * v.stride(1);
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = j < k0 ? pkh + j * pk.stride(1) : kb + (j - k0) * k.stride(2);
        for (int64_t i = 0; i < G; ++i) {
          const float* qi = qb + i * D;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < 64; ++d) dot += qi[d] * kj[d];
          s[i * n + j] = dot * sc;
        }
      }
      for (int64_t i = 0; i < G; ++i) {
        float* si = s.data() + i * n;
        float m = -INFINITY, total = 0.f;
        for (int64_t j = 0; j < n; ++j) m = std::max(m, si[j]);
        for (int64_t j = 0; j < n; ++j) total += (si[j] = std::exp(si[j] - m));
        for (int64_t j = 0; j < n; ++j) si[j] /= total;
        for (int64_t d = 0; d < 64; ++d) acc[i][d] = 0.f;
      }
      for (int64_t j = 0; j < n; ++j) {
        const float* vj = j < k0 ? pvh + j * pv.stride(1) : vb + (j - k0) * v.stride(2);
        for (int64_t i = 0; i < G; ++i) {
          const float p = s[i * n + j];
#pragma omp simd
          for (int64_t d = 0; d < 64; ++d) acc[i][d] += p * vj[d];
        }
      }
      float* ob = op + (b * H + h) * G * D;
      for (int64_t i = 0; i < G; ++i)
        for (int64_t d = 0; d < 64; ++d) ob[i * D + d] = acc[i][d];
    }
  });
  return out;
}
"""

LAYERS, KV_HEADS, GROUP, HEAD_DIM = 30, 3, 3, 64  # SmolLM2-135M


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=376, help="shared prefix tokens (the arith system prompt and tools)")
    ap.add_argument("--own", type=int, default=60, help="most keys of a row after the prefix")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    from torch.utils.cpp_extension import load_inline

    with tempfile.TemporaryDirectory() as build:
        ext = load_inline(
            "fused_attention_probe",
            cpp_sources=[KERNEL],
            functions=["decode_attention"],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            build_directory=build,
        )
    B, H, G, D, k0, own = args.batch, KV_HEADS, GROUP, HEAD_DIM, args.prefix, args.own
    gen = torch.Generator().manual_seed(0)
    store = torch.randn(LAYERS, 2, H, k0 + 64, D, generator=gen)  # FastRunner's prefix store layout
    cache = torch.randn(LAYERS, B, 2, H, k0 + own + 64, D, generator=gen)  # its per-slot cache layout
    q = torch.randn(B, H * G * D, generator=gen)
    nvalid = torch.randint(own // 2, own + 1, (B,), generator=gen)
    # the additive mask a decode step passes (key j of row b is visible iff j < nvalid[b])
    mask = torch.zeros(B, 1, 1, own).masked_fill_(
        torch.arange(own)[None, None, None, :] >= nvalid[:, None, None, None], float("-inf")
    )
    scale = D**-0.5

    def to_tokens(t: torch.Tensor) -> torch.Tensor:  # forward's layout map on the plain decode path
        return t.view(B, H, G, *t.shape[3:])

    def torch_path(li: int) -> torch.Tensor:
        k, v = cache[li, :, 0, :, k0 : k0 + own], cache[li, :, 1, :, k0 : k0 + own]
        return attend_with_shared_prefix(
            q, q.view(B, H, G, D), k, v, mask, store[li, 0, :, :k0], store[li, 1, :, :k0], scale, to_tokens
        )

    def compiled(li: int) -> torch.Tensor:
        k, v = cache[li, :, 0, :, k0 : k0 + own], cache[li, :, 1, :, k0 : k0 + own]
        return ext.decode_attention(
            q.view(B, H, G, D), store[li, 0, :, :k0], store[li, 1, :, :k0], k, v, nvalid, scale
        ).view(B, -1)

    diff = max((torch_path(li) - compiled(li)).abs().max().item() for li in range(LAYERS))
    times: dict[str, list[float]] = {"torch": [], "compiled": []}
    for fn in (torch_path, compiled):  # warm-up
        fn(0)
    for _ in range(args.repeats):
        for name, fn in (("torch", torch_path), ("compiled", compiled)):
            start = time.perf_counter()
            for li in range(LAYERS):
                fn(li)
            times[name].append((time.perf_counter() - start) / LAYERS * 1e6)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"batch {B}, prefix {k0}, own keys {nvalid.tolist()}, threads {torch.get_num_threads()}; "
        f"max abs difference {diff:.2e}"
    )
    for name, t in times.items():
        print(f"{name:9} {med[name]:7.1f} us per layer ({min(t):.1f}-{max(t):.1f})")
    print(
        json.dumps(
            {
                "torch_us": med["torch"],
                "compiled_us": med["compiled"],
                "torch_over_compiled": med["torch"] / med["compiled"],
                "max_abs_diff": diff,
            }
        )
    )


if __name__ == "__main__":
    main()
