"""Running a transformers model's backbone directly: under PEFT, and with a prefix shared by every row.

Trainers (token log-probs) and the reward-model scorer (a score at the last token) call the
backbone and their own head instead of the model's `forward`, so they pay for the head only where
they need it. Both run the prefix every row shares (system prompt, tool schemas) once:

    P = shared_prefix_length(input_ids, attention_mask, loss_mask)       # 0: no sharing
    hidden = backbone_hidden(backbone, input_ids, attention_mask, P)     # (B, T-P, H)

Shapes: B rows, T tokens per (right-padded) row, H hidden size, P shared prefix tokens.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn


@functools.cache
def _cache_name(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_name(backbone: nn.Module) -> str:
    """The name of the key/value cache, as the backbone's `forward` argument and as its output's
    field: `cache` in recent transformers 5 releases, `past_key_values` in earlier ones (5.17, which
    pyproject admits, and which a GPU machine had; passing `cache=` there falls into **kwargs and is
    ignored, so the model silently decodes without its cache)."""
    return _cache_name(type(backbone))


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The transformers `*ForCausalLM` under any PEFT wrapper.

    peft 0.21: `PeftModel.get_base_model()` returns the transformers model with the LoRA layers
    injected in place (so calling it still applies the adapters). Note `PeftModel.base_model`
    is the *tuner* (`LoraModel`), not the backbone: don't use it here.
    """
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def backbone_of(model: nn.Module) -> nn.Module:
    """The decoder stack returning hidden states, under any PEFT wrapper, of a causal LM, a
    sequence classifier (a reward model) or a bare decoder (a critic started from one): transformers'
    `get_decoder` finds the stack in each, and a bare decoder is its own."""
    inner = unwrap_causal_lm(model)
    return inner.get_decoder() if hasattr(inner, "get_decoder") else inner.model


def backbone_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(backbone: the decoder stack returning hidden states, head: the LM head) of a causal LM."""
    causal_lm = unwrap_causal_lm(model)
    backbone = backbone_of(causal_lm)
    head = causal_lm.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(causal_lm).__name__} has no output embeddings (LM head); it is not a causal LM")
    config = getattr(causal_lm, "config", None)
    for attribute in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        if getattr(config, attribute, None) not in (None, 1.0):
            raise NotImplementedError(
                f"{type(causal_lm).__name__} rescales its logits ({attribute}); the trainers apply the "
                "plain LM head only. Add the rescaling here (and a test) before training this model."
            )
    return backbone, head


MIN_SHARED_PREFIX = 16
"""Shorter shared prefixes are run per row: a second backbone call costs more than it saves. The
rollout backend forks (or prefills once) a common prompt prefix from the same length up
(rollout/backend.py); the fast runner's attention over a forked prefix has its own, kernel-level
threshold (FastRunner's `shared_prefix`, 64 tokens, measured for that kernel)."""


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """P: how many leading tokens every row has in common and may run once, or 0.

    P stops one token before the first position whose next token is trained in any row (that
    position's hidden state must come from the per-row pass), and 0 is returned for one row, left
    padding, or P < MIN_SHARED_PREFIX.

    Args: input_ids, attention_mask (B, T); loss_mask (B, T), 1 where a token is predicted (the
    hidden state one position before it is needed), as in models/logprobs.py.
    """
    if input_ids.shape[0] < 2 or input_ids.shape[1] < 2:
        return 0
    real = attention_mask.bool()  # (B, T)
    same = ((input_ids == input_ids[:1]) & real).all(0)  # (T,): the same real token in every row
    common = int(same.long().cumprod(0).sum())
    trained = loss_mask.bool().any(0)  # (T,)
    first_trained = int(trained.long().argmax()) if bool(trained.any()) else input_ids.shape[1]
    prefix = min(common, first_trained - 1, input_ids.shape[1] - 1)
    return prefix if prefix >= MIN_SHARED_PREFIX else 0


def backbone_hidden(
    backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int = 0
) -> torch.Tensor:
    """The backbone's last hidden states at positions prefix..T-1: (B, T-prefix, H).

    With prefix = P > 0 (the first P tokens are the same real tokens in every row, see
    `shared_prefix_length`), those P tokens run once, for row 0, and the rest of every row runs
    on top of their key/value cache repeated over the batch (a differentiable repeat, so each row's
    gradient reaches the prefix). Right padding only. Gradient checkpointing turns caches off in
    transformers, so it falls back to the plain pass (and returns positions prefix..T-1 of it).
    """
    if prefix <= 0 or getattr(backbone, "gradient_checkpointing", False):
        return backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state[
            :, prefix:
        ]
    name = cache_name(backbone)
    cache = getattr(
        backbone(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True), name
    )
    cache.batch_repeat_interleave(input_ids.shape[0])  # (1, heads, P, d) -> (B, heads, P, d) per layer
    return backbone(
        input_ids=input_ids[:, prefix:], attention_mask=attention_mask, use_cache=True, **{name: cache}
    ).last_hidden_state
