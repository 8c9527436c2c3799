"""Our GRPO loss and log-probs against TRL 1.16's GRPOTrainer on the same batch and weights.

We build a real `GRPOTrainer` (tiny-qwen3 saved to tmp_path, a dummy reward, CPU) and call its
`_compute_loss(model, inputs)` with a hand-built generation batch, the dict TRL's
`_generate_and_score_completions` produces: prompt_ids/prompt_mask (left-padded),
completion_ids/completion_mask (right-padded), advantages (B,), old_per_token_logps and
ref_per_token_logps (B, C), num_items_in_batch. Our side scores the same ids with
`sequence_logprobs` on the same model object and feeds `grpo_loss`. Loss, parameter gradients and
the token-level metrics must agree to float32 rounding.

Precision: GRPOConfig defaults to bf16=True, which autocasts TRL's backbone AND LM head to bfloat16
even on CPU (log-probs then differ from fp32 by ~1e-3); the comparison runs both sides in fp32.

Known, intended difference: TRL divides the loss by `current_gradient_accumulation_steps`; we
leave accumulation to the training loop, so the test sets it to 1.
Shapes: B sequences (= prompts * G), P prompt tokens, C completion tokens, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch

from agentic_rl.algorithms.grpo import GRPOLossConfig, group_advantages, grpo_loss
from agentic_rl.models.logprobs import sequence_logprobs

trl = pytest.importorskip("trl")

COMPLETION_LENGTH = 6
TEMPERATURE = 0.7

# `use_bias_correction_kl` is TRL's name for our `kl_importance_correction` (TRL's default: True).
CASES = {
    "grpo": dict(loss_type="grpo", importance_sampling_level="token", beta=0.04, epsilon_high=0.28),
    "grpo_kl_corrected": dict(
        loss_type="grpo", importance_sampling_level="token", beta=0.04, epsilon_high=None, use_bias_correction_kl=True
    ),
    "dapo": dict(loss_type="dapo", importance_sampling_level="token", beta=0.0, epsilon_high=0.28),
    "dr_grpo": dict(loss_type="dr_grpo", importance_sampling_level="token", beta=0.04, epsilon_high=None),
    "bnpo": dict(loss_type="bnpo", importance_sampling_level="token", beta=0.04, epsilon_high=None),
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04, epsilon_high=None),
    "gspo_kl_corrected": dict(
        loss_type="grpo",
        importance_sampling_level="sequence",
        beta=0.04,
        epsilon_high=0.28,
        use_bias_correction_kl=True,
    ),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_qwen3):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    model, tokenizer = tiny_qwen3
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# What each GRPOConfig field becomes on the trainer, read by `_compute_loss`. One trainer is built
# (from the "grpo" case, so that case is fully config-driven); the others set these attributes,
# which saves ~4 s of model loading per case. A TRL rename fails the hasattr check loudly.
TRAINER_ATTRIBUTES = (
    "loss_type",
    "beta",
    "importance_sampling_level",
    "epsilon_low",
    "epsilon_high",
    "max_completion_length",
)


@pytest.fixture(scope="module")
def trainer(model_dir, tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl-out")),
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=COMPLETION_LENGTH,
        temperature=TEMPERATURE,
        epsilon=0.2,
        use_bias_correction_kl=False,
        **CASES["grpo"],
        bf16=False,  # GRPOConfig defaults to bf16=True (autocast, even on CPU); compare at equal precision
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["2 + 2 ="] * 4}),
    )
    assert all(hasattr(trainer, name) for name in TRAINER_ATTRIBUTES), "TRL renamed a loss attribute"
    assert (trainer.epsilon_low, trainer.epsilon_high) == (0.2, 0.28)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; we call the loss directly
    trainer.model.train()
    return trainer


def configure(trainer, case: dict) -> None:
    """Point the trainer at `case`, as GRPOTrainer.__init__ would have from a GRPOConfig."""
    trainer.loss_type, trainer.beta = case["loss_type"], case["beta"]
    trainer.importance_sampling_level = case["importance_sampling_level"]
    trainer.epsilon_low = 0.2
    trainer.epsilon_high = 0.2 if case["epsilon_high"] is None else case["epsilon_high"]
    trainer.args.use_bias_correction_kl = case.get("use_bias_correction_kl", False)
    trainer._metrics["train"].clear()


@pytest.fixture(scope="module")
def batch(trainer):
    return generation_batch(trainer.model, trainer.processing_class.pad_token_id)


def generation_batch(model, pad_id: int) -> dict[str, torch.Tensor]:
    """What TRL's _generate_and_score_completions hands to _compute_loss, with off-policy old
    log-probs (so the ratio is not 1 and clipping happens) and a perturbed reference."""
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(0, vocab, (4, 5), generator=generator)  # (B, P)
    prompt_mask = torch.ones(4, 5, dtype=torch.long)  # (B, P)
    prompt_mask[1, :2] = 0  # left padding, as TRL pads prompts
    prompt_ids[1, :2] = pad_id
    completion_ids = torch.randint(0, vocab, (4, COMPLETION_LENGTH), generator=generator)  # (B, C)
    completion_mask = torch.ones(4, COMPLETION_LENGTH, dtype=torch.long)  # (B, C)
    for row, length in enumerate([6, 1, 4, 3]):  # ragged, one 1-token completion
        completion_mask[row, length:] = 0
        completion_ids[row, length:] = pad_id
    with torch.no_grad():
        current, _ = sequence_logprobs(
            model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            torch.cat([torch.zeros_like(prompt_mask), completion_mask], 1),
            TEMPERATURE,
        )
    current = current[:, -COMPLETION_LENGTH:]  # (B, C)
    noise = lambda scale: scale * torch.randn(current.shape, generator=generator)  # noqa: E731
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": group_advantages(torch.tensor([1.0, 0.0, 0.5, 2.0]), 2),  # (B,)
        "old_per_token_logps": (current + noise(0.3)) * completion_mask,  # (B, C)
        "ref_per_token_logps": (current + noise(0.5)) * completion_mask,  # (B, C)
        "num_items_in_batch": completion_mask.sum(),
    }


def our_loss(model, inputs, cfg: GRPOLossConfig):
    """The same batch through sequence_logprobs + grpo_loss, on full (B, P + C) rows."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # (B, P+C)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # (B, P+C)
    prompt_zeros = torch.zeros_like(inputs["prompt_mask"], dtype=torch.float32)  # (B, P)
    loss_mask = torch.cat([prompt_zeros, inputs["completion_mask"].float()], dim=1)  # (B, P+C)
    widen = lambda completion_part: torch.cat([prompt_zeros, completion_part], dim=1)  # noqa: E731  (B, P+C)
    logps, _ = sequence_logprobs(model, input_ids, attention_mask, loss_mask, TEMPERATURE)  # (B, P+C)
    ref = widen(inputs["ref_per_token_logps"]) if cfg.beta else None
    return grpo_loss(logps, widen(inputs["old_per_token_logps"]), inputs["advantages"], loss_mask, cfg, ref)


def gradients(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("name", list(CASES))
def test_loss_and_gradients_equal_trl_grpo_trainer(name, trainer, batch):
    """Guards against drifting from TRL's objective (normalisation, clip bounds, GSPO ratio,
    k3 KL and its IS correction, temperature): same batch, same weights -> same loss and same
    parameter gradients."""
    case = CASES[name]
    configure(trainer, case)
    model, inputs = trainer.model, batch
    settings = {key: value for key, value in case.items() if key != "use_bias_correction_kl"}
    cfg = GRPOLossConfig(
        epsilon=0.2,
        scale_rewards="group",
        **settings,
        kl_importance_correction=case.get("use_bias_correction_kl", False),
        max_completion_length=COMPLETION_LENGTH if case["loss_type"] == "dr_grpo" else None,
    )

    model.zero_grad(set_to_none=True)
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = gradients(model)
    loss, metrics = our_loss(model, inputs, cfg)
    loss.backward()
    our_grads = gradients(model)

    torch.testing.assert_close(loss.detach(), trl_loss.detach(), atol=1e-6, rtol=1e-5)
    assert len(our_grads) == len(trl_grads) > 0
    for ours, theirs in zip(our_grads, trl_grads):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4)
    trl_metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    assert trl_metrics["clip_ratio/region_mean"] + float(metrics["loss/clip_ratio_region"]) > 0, "no clipping tested"
    if case["importance_sampling_level"] == "token":  # TRL averages GSPO clip fractions over all B rows
        assert float(metrics["loss/clip_ratio_low"]) == pytest.approx(trl_metrics["clip_ratio/low_mean"], abs=1e-6)
        assert float(metrics["loss/clip_ratio_high"]) == pytest.approx(trl_metrics["clip_ratio/high_mean"], abs=1e-6)
    if case["beta"]:
        assert float(metrics["loss/kl"]) == pytest.approx(trl_metrics["kl"], rel=1e-5)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_equal_trl_formula(scale):
    """TRL computes advantages inline in _generate_and_score_completions (not callable alone);
    this replays its sum_then_normalize lines with its own `nanstd` (Bessel-corrected)."""
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 0.25, 1.5])
    group_size = 4
    mean = torch.nanmean(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)
    expected = rewards - mean
    if scale != "none":
        expected = expected / (std + 1e-4)
    torch.testing.assert_close(group_advantages(rewards, group_size, scale), expected)
