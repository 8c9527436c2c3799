"""PPO trainer on tiny-qwen3: the actor-critic module, the batch's rewards, returns and
advantages, micro-batching, the separate critic, and exact resume (in process and after SIGKILL).

As in tests/test_grpo_trainer.py, the test-only `token_parity` reward (tests/helpers_training.py)
varies with the sampled ids, so a random model's episodes earn different rewards.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from helpers_references import assert_same_sum, float64_model
from helpers_training import adapters, bound, ppo_cfg, random_lora  # registers the test reward and envs
from sigkill import interrupt_then_resume, run_until

from agentic_rl.models.logprobs import sequence_logprobs
from agentic_rl.algorithms.ppo import gae
from agentic_rl.config import ConfigError, load_config
from agentic_rl.models.backbone import backbone_and_head
from agentic_rl.training.actor_critic import ActorCritic
from agentic_rl.training.ppo import PPO, train_ppo
from agentic_rl.training.scoring import reference_logprobs
from agentic_rl.training.metrics_file import read_metrics

REPO = Path(__file__).resolve().parent.parent


def _ids(tokenizer, rows: int = 2):
    text = [
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\nIt is 5.",
        "<|im_start|>user\nHi<|im_end|>\n",
    ]
    batch = tokenizer(text[:rows], return_tensors="pt", padding=True)
    mask = batch["attention_mask"].clone()
    mask[:, :4] = 0  # the first tokens are "prompt"
    return batch["input_ids"], batch["attention_mask"], mask


def test_actor_critic_scores_like_the_policy_and_reads_values_from_the_sampling_states(tiny_qwen3, new_tiny_qwen3):
    """Guards against a value head read at the wrong position (V must be the value of the state
    the token is sampled from: the hidden state one position before it) or at untrained positions,
    and against the value path changing the policy's log-probs."""
    from agentic_rl.models.lora import LoraConfig, apply_lora

    policy = apply_lora(new_tiny_qwen3().double(), LoraConfig(r=4))
    random_lora(policy)
    model = ActorCritic(policy).double()
    ids, attention, mask = _ids(tiny_qwen3[1])
    logps, _, values = model(ids, attention, mask)
    torch.testing.assert_close(logps, sequence_logprobs(policy, ids, attention, mask)[0], atol=0, rtol=0)
    assert bool((values == 0).all()), "the head starts at zero"
    with torch.no_grad():
        model.value_head.weight.normal_(0, 1.0)
        model.value_head.bias.fill_(0.25)
    _, _, values = model(ids, attention, mask)
    backbone, _ = backbone_and_head(policy)
    hidden = backbone(input_ids=ids, attention_mask=attention).last_hidden_state  # (B, T, H), float64
    expected = torch.zeros_like(values)
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            if mask[b, t]:
                expected[b, t] = float(hidden[b, t - 1] @ model.value_head.weight[0]) + 0.25
    torch.testing.assert_close(values, expected, atol=1e-9, rtol=0)
    assert bool((values[mask == 0] == 0).all())


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_the_value_loss_trains_the_shared_trunk_but_never_a_separate_critics_policy(tmp_path, critic):
    """shared: the value gradient reaches the policy's adapters (one trunk); separate: it reaches
    only the critic, and the optimizer groups put the value model at lr × lr_multiplier."""
    cfg = ppo_cfg(tmp_path, f"value.critic={critic}")
    model, objective = bound(cfg, critic=critic == "separate")
    ids, attention, mask = _ids(objective.sampler.tokenizer)
    with torch.no_grad():
        model.value_head.weight.normal_(0, 0.1)
    _, _, values = model(ids, attention, mask)
    (values**2).sum().backward()
    policy_grads = [p.grad for n, p in model.policy.named_parameters() if p.requires_grad]
    reached = any(g is not None and float(g.abs().max()) > 0 for g in policy_grads)
    assert reached == (critic == "shared")
    if critic == "separate":
        assert any(float(p.grad.abs().max()) > 0 for p in model.critic.parameters() if p.grad is not None)
    groups = model.optimizer_groups(1e-3)
    assert [g["lr"] for g in groups] == [1e-3, pytest.approx(1e-3 * cfg.value.lr_multiplier)]
    assert sum(len(g["params"]) for g in groups) == sum(1 for p in model.parameters() if p.requires_grad)


def test_the_first_batch_returns_are_the_episode_reward_on_every_policy_token(tmp_path):
    """With V ≡ 0 (a fresh head), γ = λ = 1 and no KL, GAE's return at every policy token is the
    reward still to come: the whole episode reward, which sits on its last policy token. Guards
    against rewards on the wrong token, returns leaking onto prompt or padding, and whitening over
    the wrong positions."""
    cfg = ppo_cfg(tmp_path, "loss.lam_per_token=1.0", "loss.gamma_per_token=1.0")
    _, objective = bound(cfg)
    batch = objective.batch_for(0)
    mask = batch.tensors.loss_mask.bool()
    totals = [traj.reward_components for traj in batch.trajectories]
    assert len({round(t["token_parity"], 6) for t in totals}) > 1, "the test reward must vary"
    for row, traj in enumerate(batch.trajectories):
        total = sum(traj.reward_components[name] * w for name, w in (("token_parity", 1.0), ("format", 0.5)))
        assert bool(mask[row].any())
        torch.testing.assert_close(
            batch.returns[row][mask[row]], torch.full((int(mask[row].sum()),), total), atol=1e-6, rtol=0
        )
        last = traj.policy_spans[-1].end - 1
        assert bool(mask[row, last]) and not bool(mask[row, last + 1 :].any())
    assert bool((batch.returns[~mask] == 0).all()) and bool((batch.advantages[~mask] == 0).all())
    assert bool((batch.old_values == 0).all())
    kept = batch.advantages[mask].double()
    assert kept.mean().item() == pytest.approx(0.0, abs=1e-6) and kept.std().item() == pytest.approx(1.0, abs=1e-4)
    assert batch.tokens == float(mask.sum())
    assert batch.metrics["value/explained_variance"] == pytest.approx(0.0, abs=1e-9)  # V ≡ 0 explains nothing


def test_the_batch_advantages_are_gae_of_its_own_values_and_rewards(tmp_path):
    """A trained head (V ≠ 0), γ < 1, λ < 1, KL in the reward: the batch must hold exactly
    whiten(GAE(rewards − β·(log π_old − log π_ref), V_old)), recomputed here from its parts."""
    cfg = ppo_cfg(
        tmp_path, "loss.lam_per_token=0.9", "loss.gamma_per_token=0.95", "loss.beta=0.1", "old_logprobs=recompute"
    )
    model, objective = bound(cfg)
    with torch.no_grad():
        model.value_head.weight.normal_(0, 0.05)
    batch = objective.batch_for(0)
    t, mask = batch.tensors, batch.tensors.loss_mask
    assert float(batch.old_values[mask.bool()].abs().min()) > 0
    rewards = torch.zeros(mask.shape, dtype=torch.float64)
    for row, traj in enumerate(batch.trajectories):
        rewards[row, traj.policy_spans[-1].end - 1] = (
            traj.reward_components["token_parity"] + 0.5 * traj.reward_components["format"]
        )
    ref = reference_logprobs(
        objective.sampler.policy, None, t, cfg, objective.accelerator
    ).double()  # LoRA: adapters off
    rewards = rewards - 0.1 * (batch.old_logprobs.double() - ref) * mask
    advantages, returns = gae(rewards, batch.old_values.double(), mask, 0.95, 0.9)
    torch.testing.assert_close(batch.returns.double(), returns, atol=1e-5, rtol=0)
    kept = advantages[mask.bool()]
    torch.testing.assert_close(
        batch.advantages[mask.bool()].double(), (kept - kept.mean()) / kept.std(), atol=1e-4, rtol=0
    )
    assert batch.metrics["value/kl_in_reward"] != 0


def test_gradient_is_the_same_for_any_micro_batch_size(tmp_path):
    """Guards the token normaliser: the accumulated gradient of micro-batches of 1 equals the
    full-batch one."""
    cfg = ppo_cfg(tmp_path, "loss.beta=0.04", "loss.kl_mode=loss", "rollout.max_turn_tokens=6")
    model, objective = bound(cfg)
    with torch.no_grad():
        model.value_head.weight.normal_(0, 0.05)
    batch = objective.batch_for(0)

    def gradient(micro_batch_size: int) -> dict[str, torch.Tensor]:
        objective.cfg = dataclasses.replace(cfg, micro_batch_size=micro_batch_size)
        model.zero_grad(set_to_none=True)
        micros = objective.micro_batches(batch)
        assert len(micros) == -(-4 // micro_batch_size)
        for micro in micros:
            objective.loss(model, micro)[0].backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    float64_model(model)  # one sum in two orders: compared in float64, whatever the CPU (assert_same_sum)
    full, split = gradient(4), gradient(1)
    assert float(full["value_head.weight"].abs().max()) > 0
    assert_same_sum(split, full)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """An uninterrupted 4-step run (checkpoint every 2, KL in the reward), shared below."""
    out = tmp_path_factory.mktemp("ppo") / "straight"
    return out, train_ppo(ppo_cfg(out, "train.steps=4", "train.checkpoint_every=2", "loss.beta=0.04"))


def test_ppo_end_to_end_trains_the_policy_and_the_value_head(straight_run):
    """Guards against a PPO run that never updates the adapters or the value head, logs non-finite or missing
    metrics, or rolls out stale weights."""
    out, result = straight_run
    history = result["history"]
    assert len(history) == 4
    for step, row in enumerate(history, start=1):
        assert all(torch.isfinite(torch.tensor(float(v))) for k, v in row.items() if k != "optim/grad_norm"), row
        assert row["rollout/weights_version"] == float(step)
        for key in ("loss/policy", "loss/value", "value/mean", "value/explained_variance", "value/kl_in_reward"):
            assert key in row, key
    assert history[0]["value/mean"] == 0.0, "a fresh head predicts 0"
    assert history[0]["rollout/logprob_drift_max"] < 1e-3 and history[0]["time/audit"] > 0  # the audit on start
    assert history[-1]["value/mean"] != 0.0, "the value head must have learned something"
    assert any(row["loss/value"] > 0 for row in history)
    lora_b = [v for k, v in adapters(out).items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().max()) > 0 for v in lora_b)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]


def test_ppo_resume_after_in_process_interruption_matches_the_uninterrupted_run(straight_run, tmp_path, monkeypatch):
    """Guards against a resume that loses the value head (it lives only in the checkpoint: the
    shared trunk's next updates would then differ) or the rollout weights version."""

    out = tmp_path / "split"
    resumed = interrupt_then_resume(
        monkeypatch, PPO, train_ppo, ppo_cfg(out, "train.steps=4", "train.checkpoint_every=2", "loss.beta=0.04")
    )
    assert [r["rollout/weights_version"] for r in resumed["history"]] == [3.0, 4.0]
    straight, _ = straight_run
    expected, got = adapters(straight), adapters(out)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    a, b = read_metrics(straight / "metrics.jsonl"), read_metrics(out / "metrics.jsonl")
    assert [r["value/mean"] for r in a] == [r["value/mean"] for r in b]


@pytest.mark.e2e
@pytest.mark.skipif(os.environ.get("AGENTIC_RL_SKIP_KILL_TEST") == "1", reason="disabled by env")
def test_ppo_resume_after_a_real_sigkill_matches_the_uninterrupted_run(straight_run, tmp_path):
    """Guards against PPO checkpoints that are complete only on a clean exit: a SIGKILLed run resumes to the
    uninterrupted run's weights."""
    out = tmp_path / "killed"
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "import helpers_training as t\n"
        "from agentic_rl.training.ppo import train_ppo\n"
        "train_ppo(t.ppo_cfg(%r, 'train.steps=4', 'train.checkpoint_every=2', 'loss.beta=0.04'))\n"
    ) % (str(REPO / "tests"), str(out))
    marker = out / "checkpoints" / "step-000002" / "trainer_state.pt"
    run_until(script, marker)
    if (out / "final").exists():
        pytest.skip("the child finished before it could be killed (machine too fast for this check)")
    resumed = train_ppo(ppo_cfg(out, "train.steps=4", "train.checkpoint_every=2", "loss.beta=0.04"))
    assert len(resumed["history"]) <= 2
    straight, _ = straight_run
    expected, got = adapters(straight), adapters(out)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_a_separate_critic_trains_without_touching_the_policy_through_the_value_loss(tmp_path):
    """Guards against value.critic=separate failing end to end or leaving its head at 0 (its gradient routing is
    checked on one batch above)."""
    result = train_ppo(ppo_cfg(tmp_path / "sep", "value.critic=separate", "train.steps=2"))
    assert len(result["history"]) == 2 and result["history"][-1]["value/mean"] != 0.0


def _tiny_reward_model(tmp_path: Path) -> tuple[Path, Path]:
    """(an `agentic-rl rm` folder, its base): tiny-qwen3 saved as a model folder (so the RM's LoRA
    adapters name their base, as with a real model), with non-zero adapters and score head."""
    from agentic_rl.models.loader import TINY_QWEN3, build_tiny_qwen3, load_tokenizer
    from agentic_rl.models.policy import ModelConfig
    from agentic_rl.models.reward_scorer import load_reward_model, save_reward_model

    base = tmp_path / "base"
    build_tiny_qwen3().save_pretrained(base)
    load_tokenizer(TINY_QWEN3).save_pretrained(base)
    torch.manual_seed(0)
    classifier, tokenizer, name = load_reward_model(
        load_config(ModelConfig, None, overrides=[f"name={base}", "lora.r=4"]), log=lambda *a: None
    )
    with torch.no_grad():
        for key, p in classifier.named_parameters():
            if "lora_B" in key or "score" in key:
                p.normal_(0, 0.5)
    save_reward_model(classifier, tokenizer, tmp_path / "rm", name)
    return tmp_path / "rm", base


def test_a_critic_started_from_a_reward_model_values_each_state_as_the_rm_scores_it(tmp_path):
    """value.model = an RM folder: V(s_t), read where token t is sampled, equals the RM's score of
    the conversation up to token t (the RM pools the last real token's hidden state: the same
    state). Guards against a head left at zero, the RM's adapters not merged (their deltas lost),
    and a value read one position off. Only the critic's fresh adapters and the head train."""
    from agentic_rl.models.policy import load_policy
    from agentic_rl.models.reward_scorer import load_trained_reward_model
    from agentic_rl.training.ppo import load_critic

    rm, base = _tiny_reward_model(tmp_path)
    cfg = ppo_cfg(tmp_path / "run", f"model.name={base}", "value.critic=separate", f"value.model={rm}")
    policy, tokenizer, _ = load_policy(cfg.model, log=lambda *a: None)
    critic, head_weight = load_critic(cfg, tokenizer, log=lambda *a: None)
    model = ActorCritic(policy, critic, cfg.value.lr_multiplier, head_weight)
    ids, attention, mask = _ids(tokenizer, rows=1)  # (1, T), no padding
    with torch.no_grad():
        _, _, values = model(ids, attention, mask)
        scorer, _ = load_trained_reward_model(rm)
        positions = [t for t in range(ids.shape[1]) if mask[0, t]]
        expected = torch.tensor([float(scorer(ids[:, :t], attention[:, :t])[0]) for t in positions])
    assert len(positions) >= 10 and float(expected.abs().min()) > 0
    torch.testing.assert_close(values[0, positions], expected, atol=1e-5, rtol=1e-5)
    trainable = [key for key, p in critic.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in key for key in trainable)

    result = train_ppo(
        ppo_cfg(tmp_path / "ppo", f"model.name={base}", "value.critic=separate", f"value.model={rm}", "train.steps=1")
    )
    assert result["history"][0]["value/mean"] != 0.0, (
        "V_old of the first batch comes from the RM's head, not a zero head"
    )


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("selection.dynamic_sampling=true", "needs rollout.group_size >= 2"),
        ("rollout.batch_size=6 rollout.group_size=4", "batch_size = prompts × G"),
        ("value.critic=both", "value.critic"),
    ],
)
def test_bad_config_fails_at_load_with_an_explanation(tmp_path, override, fragment):
    """Guards against PPO configs that cannot work (dynamic sampling without groups, a batch that is not whole
    groups, an unknown critic) failing late."""
    with pytest.raises(ConfigError) as info:
        ppo_cfg(tmp_path, *override.split())
    assert fragment in str(info.value)


def test_explained_variance_by_hand_and_undefined_when_every_return_is_equal():
    """Returns [1, 0, 0, 1] (mean 0.5, unbiased variance 1/3): V = R explains all of it, V = 0.5
    none, V = [0.5, 0.5, 0, 0] less than none (R − V = [0.5, −0.5, 0, 1], variance 5/12: 1 − 5/4);
    all-equal returns have no variance to explain."""
    import math

    from agentic_rl.algorithms.ppo import masked_moments
    from agentic_rl.training.ppo import _explained_variance

    returns, mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]]), torch.ones(1, 4)
    for values, expected in (
        (returns, 1.0),
        (torch.full((1, 4), 0.5), 0.0),
        (torch.tensor([[0.5, 0.5, 0.0, 0.0]]), -0.25),
    ):
        got = _explained_variance(masked_moments(returns - values, mask), masked_moments(returns, mask))
        assert got == pytest.approx(expected, abs=1e-9), values
    assert math.isnan(
        _explained_variance(masked_moments(torch.zeros(1, 4), mask), masked_moments(torch.zeros(1, 4), mask))
    )


def test_a_batch_whose_episodes_all_failed_stops_the_run_before_it_trains(tmp_path, capsys):
    """Guards against a run whose every episode failed (its env or tools raise) finishing with exit 0
    having learnt nothing: it stops (RunStopped: a non-zero exit) before the update, each failure
    printed with its error, and no checkpoint written from the batch."""
    from agentic_rl.errors import RunStopped

    with pytest.raises(RunStopped, match=r"every episode of this batch failed \(4 of 4, each printed above"):
        train_ppo(
            ppo_cfg(
                tmp_path / "failed",
                "env.name=flaky_arith",
                "env.options={}",
                "env.task_pool=1",
                "rollout.group_size=4",
                "train.steps=1",
            )
        )
    assert capsys.readouterr().out.count("RuntimeError: tool server exploded") == 4
    assert not (tmp_path / "failed" / "checkpoints").exists()
