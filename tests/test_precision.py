"""The "auto" precision: bf16 only where this machine runs bf16 matmuls fast (models/precision.py)."""

import warnings

import pytest
import torch

from agentic_rl.models import precision
from agentic_rl.models.precision import resolve_mixed_precision, resolve_rollout_dtype


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Pretend this CPU's oneDNN does (True) or does not (False) run bf16 linears."""

    def set_fast(fast: bool) -> None:
        monkeypatch.setattr(precision, "mkldnn_linear_works", lambda dtype: fast if dtype == torch.bfloat16 else True)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    return set_fast


@pytest.mark.parametrize("fast, rollout, training", [(True, "bfloat16", "bf16"), (False, "float32", "no")])
def test_auto_is_bf16_exactly_where_bf16_is_fast(cpu_bf16, fast, rollout, training):
    """Guards against an auto that picks bf16 on a CPU where it runs through the scalar fallback."""
    cpu_bf16(fast)
    assert resolve_rollout_dtype("auto") == rollout and resolve_mixed_precision("auto") == training
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # explicit float32 / no never warn
        assert resolve_rollout_dtype("float32") == "float32" and resolve_mixed_precision("no") == "no"


def test_an_explicit_bf16_is_kept_and_warned_about_where_it_is_slow(cpu_bf16):
    """Guards against an explicit bf16 being silently changed, or being ~60x slower without a word, on a CPU
    without fast bf16."""
    cpu_bf16(False)
    with pytest.warns(UserWarning, match="60x slower"):
        assert resolve_rollout_dtype("bfloat16") == "bfloat16"
    with pytest.warns(UserWarning, match="use auto or no"):
        assert resolve_mixed_precision("bf16") == "bf16"
    cpu_bf16(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_rollout_dtype("bfloat16") == "bfloat16" and resolve_mixed_precision("bf16") == "bf16"


def test_the_probe_agrees_with_a_bf16_linear_on_this_machine():
    """The probe runs a real oneDNN bf16 linear; where it says yes, that linear gives the product."""
    if not precision.mkldnn_linear_works(torch.bfloat16):
        pytest.skip("this CPU's oneDNN has no bf16 linear: auto resolves to float32 here")
    w = torch.ops.mkldnn._reorder_linear_weight(2 * torch.eye(4, dtype=torch.bfloat16), 1)
    out = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 4, dtype=torch.bfloat16), w, None, "none", [], "")
    assert torch.equal(out.float(), 2 * torch.ones(1, 4))


def test_grpo_with_auto_rollouts_follows_the_resolved_dtype_for_pi_old(cpu_bf16):
    """Guards against sampling log-probs used as π_old when auto decodes in bf16 (other weights)."""
    from agentic_rl.config import load_config
    from agentic_rl.training.grpo_config import GRPOConfig

    cpu_bf16(False)  # auto -> float32: the sampler's log-probs are the fp32 model's
    assert load_config(GRPOConfig, None, ["rollout.dtype=auto", "old_logprobs=sampling"]).rollout.dtype == "auto"
    cpu_bf16(True)  # auto -> bfloat16: they are not
    with pytest.raises(ValueError, match=r"rollout\.dtype=auto \(bfloat16 on this machine\).*old_logprobs: detach"):
        load_config(GRPOConfig, None, ["rollout.dtype=auto", "old_logprobs=sampling"])
