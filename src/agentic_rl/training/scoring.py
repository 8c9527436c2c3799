"""`TokenScorer`: the module the training loop prepares (DDP/FSDP/DeepSpeed wrap it).

Its forward returns per-token log-probs via `sequence_logprobs` (LM head only on trained
positions). Going through this module's forward, rather than calling the backbone of an
unwrapped model, is what lets DDP hook the backward pass and all-reduce gradients, and what
lets FSDP gather the root's weights (embeddings, final norm, the tied head) around the pass.

Under FSDP and DeepSpeed ZeRO-3 each rank holds only a shard of every weight, so the unwrapped
policy is no usable model: `full_policy_state_dict` gathers the whole one for saving, and
`require_replicated_weights` stops the commands that need whole weights outside the forward
(GRPO's and PPO's rollouts, the reward model's head) before they train on shards.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import DistributedType

from agentic_rl.models.logprobs import sequence_logprobs


class TokenScorer(torch.nn.Module):
    """Wraps a causal LM (optionally PEFT); forward -> (logps (B, T), entropy (B, T) | None)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy
        # The policy's block classes (Qwen3DecoderLayer, LlamaDecoderLayer...): FSDP's
        # TRANSFORMER_BASED_WRAP reads them from the module it wraps, this one, when an accelerate
        # config names none, so configs/accelerate/fsdp.yaml fits every model family.
        self._no_split_modules = list(getattr(policy, "_no_split_modules", None) or [])

    def forward(
        self,
        input_ids,
        attention_mask,
        loss_mask,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ):
        return sequence_logprobs(
            self.policy, input_ids, attention_mask, loss_mask, temperature, with_entropy, entropy_grad=entropy_grad
        )


def unwrap_policy(model: torch.nn.Module, accelerator) -> torch.nn.Module:
    """The policy inside a prepared TokenScorer (or the model itself)."""
    inner = accelerator.unwrap_model(model)
    return inner.policy if isinstance(inner, TokenScorer) else inner


def shards_weights(accelerator) -> bool:
    """True when each rank holds only a shard of the weights: FSDP, or DeepSpeed ZeRO-3."""
    if accelerator.distributed_type == DistributedType.FSDP:
        return True
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return accelerator.state.deepspeed_plugin.zero_stage == 3
    return False


def full_policy_state_dict(model: torch.nn.Module, accelerator) -> dict[str, torch.Tensor] | None:
    """The policy's whole state dict, gathered from the shards of a prepared TokenScorer (on the
    main process; a collective, so every rank must call it); None when the weights are not
    sharded, where the unwrapped policy's own state dict is already whole."""
    if not shards_weights(accelerator):
        return None
    state = accelerator.get_state_dict(model)  # keys "policy.<name>": TokenScorer's
    prefix = "policy."
    whole = {name[len(prefix) :]: value for name, value in (state or {}).items() if name.startswith(prefix)}
    # The gathered copies of tied weights (lm_head = embed_tokens) no longer share storage, so
    # save_pretrained would write both: keep each parameter once, under its first name.
    policy = unwrap_policy(model, accelerator)
    aliases = {name for name, _ in policy.named_parameters(remove_duplicate=False)} - {
        name for name, _ in policy.named_parameters()
    }
    return {name: value for name, value in whole.items() if name not in aliases}


def require_replicated_weights(accelerator, command: str) -> None:
    """ValueError when `command` cannot run on sharded weights (see the module docstring)."""
    if shards_weights(accelerator):
        raise ValueError(
            f"`agentic-rl {command}` needs whole weights on every rank, but this launch shards them "
            f"({accelerator.distributed_type}); launch it with DDP (torchrun, or accelerate's "
            "multi-GPU config) or DeepSpeed ZeRO-2 (configs/accelerate/deepspeed_zero2.yaml). "
            "FSDP and ZeRO-3 are supported for `agentic-rl sft`."
        )


@torch.no_grad()
def reference_logprobs(
    policy: torch.nn.Module, reference: torch.nn.Module | None, tensors: Any, cfg: Any, accelerator: Any
) -> torch.Tensor:
    """(R, T) log-probs under π_ref, in micro-batches of `cfg.micro_batch_size` rows, at the rollout's
    temperature (`cfg.rollout.sampling.temperature`, as every trained token is scored): the frozen
    `reference` (a full fine-tune), or `policy` with its LoRA adapters disabled (reference None:
    the base model, no second copy in memory). They run in the precision the loss runs in (the
    loop's autocast, e.g. bf16), so the KL term compares like with like."""
    out = torch.zeros_like(tensors.logprobs)
    micro_batch_size, temperature = cfg.micro_batch_size, cfg.rollout.sampling.temperature
    for start in range(0, tensors.input_ids.shape[0], micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        args = (
            tensors.input_ids[rows].to(accelerator.device),
            tensors.attention_mask[rows].to(accelerator.device),
            tensors.loss_mask[rows].to(accelerator.device),
        )
        with accelerator.autocast():
            if reference is not None:
                logps, _ = sequence_logprobs(reference, *args, temperature=temperature)
            else:
                with policy.disable_adapter():
                    logps, _ = sequence_logprobs(policy, *args, temperature=temperature)
        out[rows] = logps.float().cpu()
    return out
