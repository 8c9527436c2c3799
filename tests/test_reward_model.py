"""Reward model: the Bradley-Terry loss against float64 by hand, corrupted pairs, and a tiny
end-to-end `train_rm` run (tiny-qwen3)."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch
from helpers_references import assert_same_sum, float64_model
from safetensors.torch import load_file

from agentic_rl.algorithms.reward_model import bradley_terry_loss
from agentic_rl.config import load_config
from agentic_rl.envs.base import make_env
from agentic_rl.envs.oracle import play_oracle
from agentic_rl.training.reward_model import RMConfig, corrupt_messages, train_rm
from agentic_rl.training.metrics_file import read_metrics


def _log_sigmoid64(z: float) -> float:
    """log σ(z) in float64 without overflow: z − log(1 + e^z) for z < 0, −log(1 + e^−z) otherwise."""
    return z - math.log1p(math.exp(z)) if z < 0 else -math.log1p(math.exp(-z))


def test_bradley_terry_loss_equals_float64_formula_including_huge_margins():
    """Guards against log(sigmoid(x)) written naively: it overflows to inf/NaN at large margins
    (a confident RM on an easy pair) and loses precision at small ones."""
    chosen = torch.tensor([0.3, 2.0, 1000.0, -1000.0, 45.5, -3.25], dtype=torch.float32, requires_grad=True)
    rejected = torch.tensor([0.1, 2.5, -1000.0, 1000.0, 45.5, 80.0], dtype=torch.float32)
    loss, accuracy = bradley_terry_loss(chosen, rejected)
    margins = [c - r for c, r in zip(chosen.tolist(), rejected.tolist())]
    expected = -sum(_log_sigmoid64(m) for m in margins) / len(margins)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    assert expected > 300  # the −2000 margin contributes 2000 / 6: a naive version gives inf here
    assert float(accuracy) == pytest.approx(2 / 6)  # ties (45.5 vs 45.5) count as wrong
    loss.backward()
    assert torch.isfinite(chosen.grad).all()
    expected_grad = [
        -math.exp(_log_sigmoid64(-m)) / len(margins) for m in margins
    ]  # d/dc −log σ(c − r) / N = −σ(−m) / N
    torch.testing.assert_close(chosen.grad, torch.tensor(expected_grad, dtype=torch.float32), atol=1e-7, rtol=1e-5)
    summed, _ = bradley_terry_loss(chosen.detach(), rejected, num_pairs=1.0)
    assert float(summed) == pytest.approx(expected * len(margins), rel=1e-6)


def test_corrupted_demonstration_has_a_wrong_final_answer():
    """Guards against "rejected" sides that are secretly correct (e.g. a corruption of 0, or a
    rounding that maps back to the right value): the RM would learn noise."""
    env = make_env("arith", difficulty=[1, 2, 3])
    rng = random.Random(0)
    tasks = env.tasks("train", n=40, seed=3)
    wrong_tools = 0
    for task in tasks:
        conversation = play_oracle(env, task).conversation
        corrupted = corrupt_messages(conversation, rng)
        assert corrupted is not None
        final = re.search(r"Final Answer:\s*(-?[\d,]*\.?\d+)", corrupted[-1]["content"])
        assert final is not None
        assert float(final.group(1).replace(",", "")) != float(task.answer), task.id
        assert corrupted[:-1] == conversation[:-1] or any(m.get("role") == "tool" for m in corrupted)
        assert conversation[-1]["content"] != corrupted[-1]["content"]
        wrong_tools += sum(a != b for a, b in zip(conversation, corrupted) if a.get("role") == "tool")
    assert wrong_tools > 0, "about half the corruptions should also falsify the last tool result"
    assert (
        corrupt_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no answer"}], rng)
        is None
    )


def test_train_rm_end_to_end_on_corrupted_pairs(tmp_path):
    """Guards against an RM trainer that never updates (frozen score head or adapters), or
    that does not report held-out pairwise accuracy."""
    out = tmp_path / "rm"
    cfg = load_config(
        RMConfig,
        None,
        overrides=[
            "model.name=tiny-qwen3",
            "model.lora.r=4",
            "pairs.source=corrupted",
            "pairs.tasks=8",
            "pairs.heldout_tasks=4",
            "pairs.env.options={difficulty: 1}",
            "batch_size=4",
            "optim.lr=1e-2",
            "train.steps=3",
            f"train.output_dir={out}",
            "train.progress=false",
        ],
    )
    result = train_rm(cfg)
    assert result["pairs"] == 8 and result["heldout_pairs"] == 4
    assert 0.0 <= result["heldout_accuracy"] <= 1.0
    assert result["heldout_accuracy"] in {0.0, 0.25, 0.5, 0.75, 1.0}
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows[:3]] == [1, 2, 3]
    for row in rows[:3]:
        assert math.isfinite(row["loss/total"]) and math.isfinite(row["rm/margin"]) and row["optim/grad_norm"] > 0
    assert rows[-1]["rm/heldout_accuracy"] == result["heldout_accuracy"]
    saved = load_file(out / "final" / "adapter_model.safetensors")
    lora_b = [v for k, v in saved.items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().max()) > 0 for v in lora_b), "adapters must have moved from zero"
    assert any("score" in k for k in saved), "the score head is trained in full and must be saved"


def test_scorer_runs_the_shared_prefix_once_and_matches_the_classifier(tmp_path):
    """RewardScorer runs the prefix all rows share (the system prompt) once. Guards against an
    offset in the pooled position after the prefix, and gradients lost through the repeated cache:
    scores equal the classifier's own forward, and gradients the plain pass."""
    from agentic_rl.models.policy import ModelConfig
    from agentic_rl.models.reward_scorer import RewardScorer, load_reward_model

    classifier, tokenizer, _ = load_reward_model(
        load_config(ModelConfig, None, overrides=["name=tiny-qwen3", "lora.r=4"]), log=lambda *a: None
    )
    classifier = float64_model(classifier)
    generator = torch.Generator().manual_seed(0)
    vocab = [i for i in range(1000) if i != tokenizer.pad_token_id]
    shared = [vocab[int(i)] for i in torch.randint(0, len(vocab), (24,), generator=generator)]
    lengths = [31, 27, 40, 26]
    input_ids = torch.full((4, 40), tokenizer.pad_token_id)  # (B, T), right padded
    attention_mask = torch.zeros(4, 40, dtype=torch.long)
    for row, length in enumerate(lengths):
        own = [vocab[int(i)] for i in torch.randint(0, len(vocab), (length - 24,), generator=generator)]
        input_ids[row, :length] = torch.tensor(shared + own)
        attention_mask[row, :length] = 1
    scorer = RewardScorer(classifier)
    scores = scorer(input_ids, attention_mask)  # (B,), shared prefix of 24 tokens
    expected = classifier(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]
    torch.testing.assert_close(scores, expected.float(), atol=1e-6, rtol=0)
    params = [p for p in classifier.parameters() if p.requires_grad]
    shared_grads = torch.autograd.grad(scores.sum(), params)
    plain_grads = torch.autograd.grad(expected.sum(), params)
    # One sum in two orders (the prefix's gradient): equal up to float64 rounding, whatever the CPU.
    assert_same_sum({str(i): g for i, g in enumerate(shared_grads)}, {str(i): g for i, g in enumerate(plain_grads)})


def test_a_lora_reward_model_loads_back_from_its_folder_and_scores_as_trained(tmp_path):
    """The folder `agentic-rl rm` leaves is the reward term's and the critic's input: loaded back,
    it scores exactly as the model that was saved. Its base comes from the folder's own record,
    through our loader: PEFT's adapter config names no usable base for tiny-qwen3 (null) and, for
    SmolLM2, a cache directory of the machine that trained, so loading through it fails elsewhere."""
    from agentic_rl.models.policy import ModelConfig
    from agentic_rl.models.reward_scorer import (
        RewardScorer,
        load_reward_model,
        load_trained_reward_model,
        save_reward_model,
    )

    classifier, tokenizer, base = load_reward_model(
        load_config(ModelConfig, None, overrides=["name=tiny-qwen3", "lora.r=4"]), log=lambda *a: None
    )
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # as if trained: adapters off zero, the score head moved
        for name, param in classifier.named_parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    input_ids = torch.randint(1, 1000, (3, 17), generator=generator)  # (B, T)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 12:] = 0
    input_ids[1, 12:] = tokenizer.pad_token_id
    with torch.no_grad():
        expected = RewardScorer(classifier.eval())(input_ids, attention_mask)  # (B,)
    save_reward_model(classifier, tokenizer, tmp_path / "final", base)

    scorer, _ = load_trained_reward_model(tmp_path / "final")
    with torch.no_grad():
        scores = scorer(input_ids, attention_mask)
    assert float(expected.std()) > 1e-3, "the scores must differ between rows for the comparison to mean anything"
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


def test_corrupted_pairs_refuse_an_env_that_drops_turns():
    """memory's episodes are several token sequences: a corrupted re-render of the whole
    conversation would differ from the chosen side in shape, not only in its answer."""
    from agentic_rl.training.reward_model import PairsConfig, build_pairs
    from agentic_rl.models.loader import TINY_QWEN3, load_tokenizer

    cfg = load_config(
        PairsConfig,
        None,
        overrides=["source=corrupted", "env.name=memory", "env.options={facts: 2, gap: 2, window: 2}"],
    )
    with pytest.raises(ValueError, match="env 'memory' drops turns.*use pairs.source=sampled"):
        build_pairs(cfg, "train", 2, load_tokenizer(TINY_QWEN3), 0)


def test_sampled_pairs_decode_in_bounded_slots_and_get_the_same_episodes(monkeypatch):
    """pairs.source=sampled decodes tasks x samples_per_task episodes through at most
    pairs.max_concurrent engine slots (the others wait for a free one), and the episodes are the
    ones an engine with a slot for every episode samples, token for token (each episode has its
    own random stream). Guards against an engine sized to every episode at once: 96 tasks x 8
    samples were 768 slots, each with a KV cache of max_episode_tokens (~18 GB for SmolLM2 in
    bf16 at 1,024 tokens), on a 24 GB machine."""
    from agentic_rl.rollout import factory
    from agentic_rl.training import reward_model
    from agentic_rl.training.reward_model import PairsConfig

    slots, episodes = [], []
    build = factory.build_engine

    def recording_build(*args, **kwargs):
        slots.append(kwargs["max_concurrent"])
        engine = build(*args, **kwargs)
        run = engine.run
        engine.run = lambda envs, tasks, **kw: episodes.append(run(envs, tasks, **kw)) or episodes[-1]
        return engine

    monkeypatch.setattr(reward_model, "build_engine", recording_build)
    keys = [
        "source=sampled",
        "policy=tiny-qwen3",
        "samples_per_task=4",
        "rollout.max_turn_tokens=12",
        "rollout.max_turns=2",
        "env.options={difficulty: 1}",
    ]
    tasks = PairsConfig().env.make().tasks("train", n=3, seed=0)
    for limit in (5, 64):
        reward_model._sampled_pairs(
            load_config(PairsConfig, None, overrides=[*keys, f"max_concurrent={limit}"]), tasks, 0
        )
    assert slots == [5, 12]  # 3 tasks x 4 samples = 12 episodes: 5 slots, then one for each
    bounded, unbounded = episodes
    assert len(bounded) == len(unbounded) == 12
    assert [t.input_ids for t in bounded] == [t.input_ids for t in unbounded]
    assert len({tuple(t.input_ids) for t in bounded}) > 1  # sampled: the samples of a task differ
