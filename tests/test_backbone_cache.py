"""The key/value cache under both of transformers 5's names for it.

Recent transformers 5 releases call a decoder's cache `cache` (the forward argument and the output
field); 5.17, which pyproject admits and which the GPU machine of 2026-12-04 had, calls it
`past_key_values`, and a `cache=` argument there falls into `**kwargs` and is ignored, so a model
decodes without the tokens it was given before. `_OldNames` plays 5.17's decoder on top of the
installed one: it takes and returns `past_key_values` and drops the keyword arguments it does not know.
"""

from __future__ import annotations

import copy
import types

import torch
from torch import nn

from agentic_rl.models.backbone import backbone_hidden, backbone_of, cache_name
from agentic_rl.rollout.hf_runner import HFRunner


class _OldNames(nn.Module):
    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder
        self.config = decoder.config

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, **ignored
    ):
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **{cache_name(self.decoder): past_key_values},
        )
        return types.SimpleNamespace(
            last_hidden_state=out.last_hidden_state, past_key_values=getattr(out, cache_name(self.decoder))
        )


def test_the_cache_name_is_the_one_the_forward_takes(tiny_qwen3):
    """Guards against a cache name fixed to one transformers release instead of read off the decoder."""
    model, _ = tiny_qwen3
    decoder = backbone_of(model)
    assert cache_name(_OldNames(decoder)) == "past_key_values"
    assert cache_name(decoder) in ("cache", "past_key_values")


def test_shared_prefix_pass_is_exact_under_the_older_name(tiny_qwen3):
    """Guards against reading `.cache` off an output that holds `past_key_values` (AttributeError on
    5.17) and against a cache passed under a name the model ignores (wrong hidden states)."""
    model, _ = tiny_qwen3
    decoder = backbone_of(model)
    ids = torch.randint(10, 5000, (3, 24), generator=torch.Generator().manual_seed(0))  # (B, T)
    ids[:, :16] = ids[0, :16]  # a 16-token prefix every row shares
    attention = torch.ones_like(ids)  # (B, T)
    with torch.no_grad():
        plain = decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state[:, 16:]  # (B, 8, H)
        shared = backbone_hidden(_OldNames(decoder), ids, attention, prefix=16)  # (B, 8, H)
    assert shared.shape == plain.shape
    assert torch.allclose(shared, plain, atol=1e-5)


def test_hf_runner_keeps_its_cache_under_the_older_name(tiny_qwen3):
    """Guards against HFRunner passing `cache=` to a model that ignores it: the second chunk would
    then be decoded without the first, and its logits would differ from one pass over both."""
    model, _ = tiny_qwen3
    old = copy.deepcopy(model)
    old.model = _OldNames(old.model)
    prompt = list(range(100, 120))
    with torch.no_grad():
        runner = HFRunner(old, max_slots=2, max_len=64)
        slot = runner.alloc()
        runner.forward([slot], [prompt[:12]])
        continued = runner.forward([slot], [prompt[12:]])  # (1, V)
        reference = HFRunner(model, max_slots=2, max_len=64)
        direct = reference.forward([reference.alloc()], [prompt])  # (1, V)
    assert torch.allclose(continued, direct, atol=1e-4)
