"""GRPO trainer on tiny-qwen3: end-to-end runs, the reference pass, fail-fast config errors,
failed episodes, micro-batching invariance and exact resume.

A random model's rewards under the built-in terms are all equal (it never answers, and it
always fills the turn budget), so every advantage would be 0. `token_parity` (tests/helpers_training.py)
is a test-only reward that depends on the sampled ids, so groups have reward variance.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from helpers_references import assert_same_sum, float64_model
from helpers_training import accumulated_gradient, adapters, first_batch, grpo_cfg  # registers the test reward and envs
from sigkill import interrupt_then_resume, run_until

from agentic_rl.config import ConfigError
from agentic_rl.training.grpo import GRPO, train_grpo
from agentic_rl.training.metrics_file import read_metrics

REPO = Path(__file__).resolve().parent.parent


def _finite(row: dict) -> bool:
    return all(torch.isfinite(torch.tensor(float(v))) for k, v in row.items() if k != "optim/grad_norm")


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """An uninterrupted 4-step run (checkpoint every 2), shared by the e2e and resume tests."""
    out = tmp_path_factory.mktemp("grpo") / "straight"
    result = train_grpo(grpo_cfg(out, "train.steps=4", "train.checkpoint_every=2", "loss.beta=0.04"))
    return out, result


def test_grpo_end_to_end_trains_adapters_and_logs_every_reward_component(straight_run):
    """Guards against a run that never updates (zero advantages, frozen adapters), stale rollout
    weights (docs/design.md invariant 3), and reward terms that are summed but not logged (invariant 5)."""
    out, result = straight_run
    history = result["history"]
    assert len(history) == 4
    for step, row in enumerate(history, start=1):
        assert _finite(row), row
        for name in ("total", "token_parity", "format"):
            assert f"reward/{name}/mean" in row and f"reward/{name}/std" in row
        assert row["rollout/staleness"] == 0.0
        assert row["rollout/weights_version"] == float(step)
        assert row["rollout/failed"] == 0.0
        # old_logprobs: sampling: π_old IS the sampler's record, so there is no mismatch at all
        assert (
            row["rollout/mismatch_kl"] == 0.0 and row["rollout/is_weight_mean"] == row["rollout/is_weight_max"] == 1.0
        )
    assert any(row["reward/token_parity/std"] > 0 for row in history), "the test reward must vary"
    # the audit on start: logged once, at the first step; float32 on both sides agrees to rounding
    assert history[0]["rollout/logprob_drift_max"] < 1e-3 and history[0]["time/audit"] > 0
    assert not any("time/audit" in row for row in history[1:])
    lora_b = [v for k, v in adapters(out).items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().max()) > 0 for v in lora_b), "LoRA B starts at 0 and must have moved"
    logged = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert logged[-1]["reward/token_parity/mean"] == pytest.approx(history[-1]["reward/token_parity/mean"])


def test_grpo_resume_after_in_process_interruption_matches_the_uninterrupted_run(straight_run, tmp_path, monkeypatch):
    """Guards against a resume that re-samples different rollouts (engine seeds/RNG), trains the
    FastRunner on stale weights after loading, or loses optimizer/scheduler state (invariant 7)."""

    out = tmp_path / "split"
    resumed = interrupt_then_resume(
        monkeypatch, GRPO, train_grpo, grpo_cfg(out, "train.steps=4", "train.checkpoint_every=2", "loss.beta=0.04")
    )
    assert len(resumed["history"]) == 2
    assert [r["rollout/weights_version"] for r in resumed["history"]] == [3.0, 4.0]
    straight, _ = straight_run
    expected, got = adapters(straight), adapters(out)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    a, b = read_metrics(straight / "metrics.jsonl"), read_metrics(out / "metrics.jsonl")
    assert [r["reward/total/mean"] for r in a] == [r["reward/total/mean"] for r in b]


@pytest.mark.e2e
@pytest.mark.skipif(os.environ.get("AGENTIC_RL_SKIP_KILL_TEST") == "1", reason="disabled by env")
def test_grpo_resume_after_a_real_sigkill_matches_the_uninterrupted_run(straight_run, tmp_path):
    """Guards against checkpoints that are only complete on a clean exit (non-atomic writes) and
    against state that lives only in the dying process."""
    out = tmp_path / "killed"
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "import helpers_training as t\n"
        "from agentic_rl.training.grpo import train_grpo\n"
        "train_grpo(t.grpo_cfg(%r, 'train.steps=4', 'train.checkpoint_every=2', 'loss.beta=0.04'))\n"
    ) % (str(REPO / "tests"), str(out))
    marker = out / "checkpoints" / "step-000002" / "trainer_state.pt"
    run_until(script, marker)
    if (out / "final").exists():
        pytest.skip("the child finished before it could be killed (machine too fast for this check)")
    resumed = train_grpo(grpo_cfg(out, "train.steps=4", "train.checkpoint_every=2", "loss.beta=0.04"))
    assert len(resumed["history"]) <= 2
    straight, _ = straight_run
    expected, got = adapters(straight), adapters(out)
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def _reference_passes(monkeypatch) -> list:
    """The π_ref model of each reference pass GRPO runs from now on (None: LoRA's adapters disabled)."""
    import agentic_rl.training.grpo as grpo_module

    passes = []
    original = grpo_module.reference_logprobs

    def recording(policy, reference, *args):
        passes.append(reference)
        return original(policy, reference, *args)

    monkeypatch.setattr(grpo_module, "reference_logprobs", recording)
    return passes


def test_beta_zero_never_runs_the_reference_pass(tmp_path, monkeypatch):
    """Guards against paying for π_ref (a full forward per batch) when β = 0 (invariant 4)."""
    calls = _reference_passes(monkeypatch)
    result = train_grpo(grpo_cfg(tmp_path / "b0", "train.steps=1", "loss.beta=0"))
    assert calls == []
    assert result["history"][0]["time/reference"] < 0.05
    assert "loss/kl" not in result["history"][0]


def test_full_finetune_with_beta_uses_a_frozen_reference_copy(tmp_path, monkeypatch, tiny_qwen3):
    """Guards against π_ref drifting with the policy (the KL would be 0 forever) or an adapter
    toggle on a model that has none, when lora.enabled=false and β > 0."""
    refs = _reference_passes(monkeypatch)
    result = train_grpo(
        grpo_cfg(tmp_path / "full", "train.steps=2", "model.lora.enabled=false", "loss.beta=0.1", "optim.lr=1e-3")
    )
    assert len(refs) == 2 and refs[0] is not None and refs[0] is refs[1]
    initial = tiny_qwen3[0].state_dict()
    assert all(not p.requires_grad for p in refs[0].parameters())
    for name, value in refs[0].state_dict().items():
        assert torch.equal(value, initial[name]), f"reference weight {name} changed"
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "full" / "final").state_dict()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial if k in trained), "the policy must have changed"
    assert result["history"][1]["loss/kl"] > 0, "after one update the policy differs from π_ref"


def test_lora_reference_is_the_base_model_with_adapters_disabled_not_a_copy(tmp_path, tiny_qwen3):
    """Guards against π_ref kept as a second copy of the weights under LoRA (twice the memory) or scored with
    the adapters on (the KL pinned at 0): with β > 0 the objective holds no reference model, and the batch's
    reference log-probs are the bare base model's, not the sampler's (invariant 4)."""
    from agentic_rl.models.logprobs import sequence_logprobs

    cfg = grpo_cfg(tmp_path, "loss.beta=0.04")
    _, objective, batch = first_batch(cfg)  # non-zero LoRA B: the adapters change the log-probs
    assert objective.reference is None
    t = batch.tensors
    with torch.no_grad():
        base, _ = sequence_logprobs(
            tiny_qwen3[0], t.input_ids, t.attention_mask, t.loss_mask, temperature=cfg.rollout.sampling.temperature
        )
    torch.testing.assert_close(batch.ref_logprobs, base, atol=1e-5, rtol=0)
    assert float((t.logprobs - base).abs().max()) > 1e-4, "the sampler ran with the adapters on"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("rollout.batch_size=6", "batch_size = prompts × G"),
        ("rewards=[{name: no_such_reward}]", "unknown reward 'no_such_reward'"),
    ],
)
def test_bad_config_fails_at_load_with_an_explanation(tmp_path, override, fragment):
    """Guards against the peers' silent failures: a batch that is not whole groups, a typo'd reward."""
    with pytest.raises(ConfigError, match="") as info:
        grpo_cfg(tmp_path, "rollout.group_size=4", override)
    assert fragment in str(info.value)


def test_missing_lora_target_module_fails_fast_naming_the_real_modules(tmp_path):
    """Guards against PEFT's behaviour of adapting nothing / failing deep inside for a typo."""
    cfg = grpo_cfg(tmp_path / "bad", "model.lora.target_modules=[nonexistent]", "train.steps=1")
    with pytest.raises(ValueError, match=r"nonexistent.*q_proj"):
        train_grpo(cfg)


def test_an_exception_inside_one_episode_fails_that_episode_and_training_goes_on(tmp_path):
    """Guards against one bad tool call killing a long run, and against training on a failed
    episode's tokens."""
    cfg = grpo_cfg(
        tmp_path / "flaky", "env.name=flaky_arith", "env.options={}", "env.task_pool=2", "train.steps=2", "loss.beta=0"
    )
    result = train_grpo(cfg)
    assert len(result["history"]) == 2
    for row in result["history"]:
        assert row["rollout/failed"] == 2.0  # the whole group of the exploding task (G = 2)
        assert row["rollout/finish/error"] == 0.5
        assert _finite(row)


def test_a_grpo_run_whose_every_episode_failed_stops_with_an_error_naming_why(tmp_path):
    """Guards against `grpo` finishing with every episode failed and exit code 0."""
    from agentic_rl.errors import RunStopped

    cfg = grpo_cfg(
        tmp_path / "all-failed",
        "env.name=flaky_arith",
        "env.options={}",
        "env.task_pool=1",
        "rollout.group_size=4",
        "train.steps=2",
    )
    with pytest.raises(
        RunStopped, match=r"every episode of this batch failed \(4 of 4.*agentic-rl envs oracle flaky_arith"
    ):
        train_grpo(cfg)


def test_a_batch_that_never_succeeds_warns_that_its_gradient_is_zero_and_what_to_do(tmp_path, capsys):
    """Guards against the README's first command running for hours from a 0%-accuracy model with every
    reward 0 and every gradient 0, and nothing saying so."""
    cfg = grpo_cfg(tmp_path / "hopeless", "rewards=[{name: accuracy}]", "train.steps=1")
    result = train_grpo(cfg)
    assert result["history"][0]["train/groups_with_variance"] == 0 and result["history"][0]["rollout/accuracy"] == 0
    out = capsys.readouterr().out
    assert (
        "WARNING: no episode of this batch succeeded and every group's rewards are equal, so this update's gradient is zero"
        in out
    )
    assert "guidance.enabled: true" in out


def test_episodes_cut_off_by_max_episode_tokens_are_reported_loudly(tmp_path, capsys, qwen3_tokenizer):
    """Guards against a run whose episodes cannot finish inside rollout.max_episode_tokens (plan's
    two-door houses need ~1100 tokens; the default is 1024) training on that silently: the share
    is logged per step and a warning names the key to raise."""
    from agentic_rl.envs.base import make_env
    from agentic_rl.models.chat_format import ChatFormat

    env = make_env("arith", difficulty=1)
    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    prompt = min(
        len(chat_format.prompt_ids(env.reset(task), env.tool_schemas)) for task in env.tasks("train", n=50, seed=0)
    )  # room for at most 3 tokens in any episode
    cfg = grpo_cfg(tmp_path, f"rollout.max_episode_tokens={prompt + 3}", "rollout.max_turn_tokens=8")
    _, objective, batch = first_batch(cfg)
    assert batch.metrics["rollout/finish/max_episode_tokens"] == 1.0
    out = capsys.readouterr().out
    assert (
        "WARNING: 100% of this batch's episodes ended at rollout.max_episode_tokens" in out
        and f"({prompt + 3} tokens" in out
    )


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_gradient_is_the_same_for_any_micro_batch_size(tmp_path, loss_type):
    """Guards against micro-batch losses scaled by the wrong share (e.g. per-micro-batch means
    that over-weight short micro-batches): accumulated gradients must equal the full-batch one."""
    cfg = grpo_cfg(
        tmp_path,
        f"loss.loss_type={loss_type}",
        "loss.beta=0.04",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_turn_tokens=6",
        "micro_batch_size=8",
    )
    model, objective, batch = first_batch(cfg)
    assert float(batch.advantages.abs().sum()) > 0
    assert len({len(t) for t in batch.trajectories}) >= 1

    def gradient(micro_batch_size: int) -> dict[str, torch.Tensor]:
        objective.cfg = dataclasses.replace(cfg, micro_batch_size=micro_batch_size)
        grads, micros = accumulated_gradient(model, objective, batch)
        assert len(micros) == -(-8 // micro_batch_size)
        return grads

    float64_model(model)  # one sum in two orders: compared in float64, whatever the CPU (assert_same_sum)
    full, split = gradient(8), gradient(2)
    assert any(float(g.abs().max()) > 0 for g in full.values())
    assert_same_sum(split, full)


def test_zero_advantage_episodes_are_skipped_and_the_gradient_is_unchanged(tmp_path):
    """With beta = 0 an episode whose advantage is 0 (a group with equal rewards) has exactly zero
    loss and gradient. Guards against skipping that changes the update: the normaliser must still
    count the skipped episodes."""
    cfg = grpo_cfg(
        tmp_path,
        "loss.beta=0",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_turn_tokens=6",
        "micro_batch_size=2",
    )
    model, objective, batch = first_batch(cfg)
    batch.advantages[:4] = 0.0  # the first group earned equal rewards
    assert float(batch.advantages[4:].abs().min()) > 0

    def gradient(skip: bool) -> tuple[dict[str, torch.Tensor], list[int]]:
        objective.cfg = dataclasses.replace(cfg, skip_zero_advantage=skip)
        grads, micros = accumulated_gradient(model, objective, batch)
        return grads, sorted(i for micro in micros for i in micro.rows)

    (skipped, trained), (full, everything) = gradient(True), gradient(False)
    assert trained == [4, 5, 6, 7] and everything == list(range(8))
    for (
        name
    ) in full:  # bit for bit: the live micro-batches [4, 5], [6, 7] are the same ops, and a dead row adds exactly 0
        torch.testing.assert_close(skipped[name], full[name], atol=0, rtol=0, msg=name)

    objective.cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, beta=0.04))
    batch.ref_logprobs = batch.tensors.logprobs.clone()
    assert len(objective.micro_batches(batch)) == 4  # beta > 0: the KL term has a gradient everywhere


def test_one_process_trains_only_the_live_rows_whatever_the_micro_batch_size(tmp_path):
    """Five live rows of eight in micro-batches of 4, on one process: the micro-batches hold rows
    3-6 and 7, and the summed gradient is the unskipped one. Guards against topping the last
    micro-batch up with zero-advantage rows (0, 1, 2) on one process, where no other rank needs
    the micro-batch counts to match: each costs a full row's forward and backward for a gradient
    of exactly 0, so only the rows list catches it. The gradient equality catches a skip that
    changes the sum: a share normalised by the live rows (5) instead of the batch's episodes (8),
    or a live row left out. It runs in float64 (float64_model), where summing the rows in another
    order moves a gradient by ~3e-15 of its scale on any CPU, so the 1e-9 bound is the arithmetic's,
    not a kernel's (float32 differed by 3.8e-7 on an AVX512 EPYC and 6.9e-6 of the scale on an
    AVX2 one, and passed 1e-7 on an AMX Xeon)."""
    cfg = grpo_cfg(
        tmp_path,
        "loss.beta=0",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_turn_tokens=6",
        "micro_batch_size=4",
    )
    model, objective, batch = first_batch(cfg)
    batch.advantages[:3] = 0.0
    assert float(batch.advantages[3:].abs().min()) > 0

    def gradient(skip: bool) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
        objective.cfg = dataclasses.replace(cfg, skip_zero_advantage=skip)
        grads, micros = accumulated_gradient(model, objective, batch)
        return grads, [list(micro.rows) for micro in micros]

    float64_model(model)  # the two layouts sum rows in different orders: see assert_same_sum
    (skipped, trained), (full, everything) = gradient(True), gradient(False)
    assert trained == [[3, 4, 5, 6], [7]] and everything == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert_same_sum(skipped, full)


def test_a_rank_with_fewer_live_rows_runs_dummy_micro_batches_that_add_no_gradient(tmp_path):
    """Under DDP every rank must run as many micro-batches as the busiest one (the all-reduce sits
    in each rank's backward). A rank with one live micro-batch whose peer has three runs two one-row
    dummies (row 0) after it, and its summed gradient is that of its live rows alone, whether row 0
    is live or not. Guards against a dummy that adds gradient (row 0 live), or records π_old
    (old_logprobs: recompute) for a row it did not train (row 0 dead), and against padding with
    zero-advantage rows, which cost a whole micro-batch each."""
    cfg = grpo_cfg(
        tmp_path,
        "loss.beta=0",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "rollout.max_turn_tokens=6",
        "micro_batch_size=4",
        "old_logprobs=recompute",
    )
    model, objective, batch = first_batch(cfg)
    advantages, one_process = batch.advantages.clone(), objective.accelerator

    class TwoRanks:  # the peer rank holds three micro-batches
        num_processes, device = 2, torch.device("cpu")

        def gather(self, count):
            return torch.cat([count, torch.tensor([3])])

    for live in (slice(4, 8), slice(0, 4)):
        batch.advantages = torch.zeros_like(advantages)
        batch.advantages[live] = advantages[live]
        objective.accelerator = one_process
        alone, micros = accumulated_gradient(model, objective, batch)
        rows = list(range(8))[live]
        assert [list(micro.rows) for micro in micros] == [rows]
        batch.old_logprobs.zero_()
        objective.accelerator = TwoRanks()
        padded, micros = accumulated_gradient(model, objective, batch)
        assert [(list(micro.rows), micro.dummy) for micro in micros] == [(rows, False), ([0], True), ([0], True)]
        for name in alone:
            torch.testing.assert_close(padded[name], alone[name], atol=0, rtol=0, msg=name)
        objective.keep_first_forward(batch, micros)  # the step's line after the update: π_old kept
        recorded = batch.old_logprobs.abs().sum(-1) > 0  # (8,)
        assert recorded.tolist() == [i in rows for i in range(8)]


def test_a_batch_without_any_gradient_still_steps_the_optimizer(tmp_path):
    """All rewards equal: every row is skipped, and the optimizer steps on zero gradients (AdamW's
    weight decay and moments move on), exactly as the unskipped run does."""
    common = ["loss.beta=0", "rewards=[{name: format}]", "train.steps=2", "optim.weight_decay=0.1"]
    skipped = train_grpo(grpo_cfg(tmp_path / "skip", *common))
    full = train_grpo(grpo_cfg(tmp_path / "full", *common, "skip_zero_advantage=false"))
    assert [row["train/episodes_trained"] for row in skipped["history"]] == [0.0, 0.0]
    assert [row["train/episodes_trained"] for row in full["history"]] == [4.0, 4.0]
    a, b = adapters(tmp_path / "skip"), adapters(tmp_path / "full")
    assert [row["optim/grad_norm"] for row in skipped["history"]] == [0.0, 0.0]
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0, msg=key)


def test_rewards_per_turn_places_the_composed_reward_without_adding_any():
    """By hand: env rewards [0.2, 0.0, 1.0] (a tool reward, then the env's own correctness), terms
    accuracy (1.0) + env_steps (weight 0.5, γ_s 0.9). The composed total is 1.0 + 0.5·(0.2 + 0.81·1.0)
    = 1.505; env_steps' share goes to its turns (0.5·0.2, 0, 0.5·0.81·1.0), the rest to the last.
    Guards against counting the env's correctness twice (once as a step reward, once as accuracy)."""
    from agentic_rl.rewards.base import RewardSpec
    from agentic_rl.rollout.trajectory import Trajectory
    from agentic_rl.training.episodes import rewards_per_turn

    traj = Trajectory(input_ids=[1], loss_mask=[0], logprobs=[0.0], spans=[], turn_rewards=[0.2, 0.0, 1.0])
    specs = [RewardSpec("accuracy"), RewardSpec("env_steps", weight=0.5, params={"gamma": 0.9})]
    placed = rewards_per_turn([traj], [1.505], specs)[0]
    assert placed == pytest.approx([0.1, 0.0, 0.405 + 1.0])
    assert sum(placed) == pytest.approx(1.505)
    only_outcome = rewards_per_turn([traj], [1.0], [RewardSpec("accuracy")])[0]
    assert only_outcome == [0.0, 0.0, 1.0], "without env_steps the env's step rewards are not used"
    empty = Trajectory(input_ids=[1], loss_mask=[0], logprobs=[0.0], spans=[])
    assert rewards_per_turn([empty], [0.7], specs) == [[0.7]]


@pytest.mark.parametrize("scale", ["group", "none"])
def test_turn_mode_with_an_outcome_reward_and_gamma_one_trains_exactly_like_episode_mode(tmp_path, scale):
    """Turn-level credit switched to the outcome-only case (γ = 1, no env_steps term) must give
    today's GRPO loss and gradient exactly: same rollouts, same loss, same gradient."""
    results = []
    for mode in ("episode", "turn"):
        cfg = grpo_cfg(
            tmp_path,
            f"advantage.mode={mode}",
            "advantage.gamma_per_turn=1.0",
            f"loss.scale_rewards={scale}",
            "loss.beta=0",
            "rollout.max_turns=2",
            "env.options={difficulty: 1, tool_success_reward: 0.3}",
        )
        model, objective, batch = first_batch(cfg)
        grads, micros = accumulated_gradient(model, objective, batch)
        loss = sum(float(objective.loss(model, micro)[0]) for micro in micros)
        results.append((loss, grads, [t.input_ids for t in batch.trajectories]))
    (loss_e, grads_e, ids_e), (loss_t, grads_t, ids_t) = results
    assert ids_e == ids_t, "both modes must train on the same rollouts"
    assert loss_t == loss_e
    assert any(float(g.abs().max()) > 0 for g in grads_e.values())
    for name in grads_e:
        torch.testing.assert_close(grads_t[name], grads_e[name], atol=0, rtol=0, msg=name)


def test_turn_position_mode_trains_on_each_turns_return_against_the_same_turns_group_mean(tmp_path):
    """advantage.mode turn_position, end to end on the first batch: every row's advantages are the
    float64 reference's (group mean of the returns-to-go at the same turn, an ended episode 0),
    from the episodes' own step rewards (through env_steps); episodes of one and two turns share
    groups (ragged_arith), so the baseline of the second turn counts the ended episodes as 0."""
    from agentic_rl.algorithms.turn_credit import discounted_turn_returns
    from agentic_rl.training.episodes import rewards_per_turn
    from helpers_references import reference_turn_advantages

    cfg = grpo_cfg(
        tmp_path,
        "advantage.mode=turn_position",
        "loss.beta=0",
        "rollout.max_turns=2",
        "rollout.batch_size=8",
        "rollout.group_size=4",
        "env.name=ragged_arith",
        "env.options={}",
        "rewards=[{name: token_parity}, {name: env_steps, weight: 1.0, params: {gamma: 0.5}}]",
    )
    _, _, batch = first_batch(cfg)
    trajs = batch.trajectories
    placed = rewards_per_turn(trajs, [t.reward for t in trajs], cfg.rewards)
    expected = reference_turn_advantages(discounted_turn_returns(placed, 1.0), cfg.rollout.group_size, "position")
    turns = [len(values) for values in placed]
    assert any(len(set(turns[g : g + 4])) > 1 for g in (0, 4)), f"a group with one- and two-turn episodes: {turns}"
    assert batch.advantages.shape == batch.tensors.input_ids.shape  # (R, T): one row per episode here
    for row, traj in enumerate(trajs):  # each turn's value on every token of the turn, 0 elsewhere
        tokens = torch.zeros(batch.advantages.shape[1], dtype=torch.float64)
        for span, value in zip(traj.policy_spans, expected[row], strict=True):
            tokens[span.start : span.end] = value
        torch.testing.assert_close(batch.advantages[row].double(), tokens, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("advantage.gamma_per_turn=0.9", "only used by the turn modes"),
        ("advantage.gamma_per_turn=1.5", "must be in [0, 1]"),
        (
            "advantage.mode=turn|advantage.gamma_per_turn=0.95|rewards=[{name: env_steps, params: {gamma: 0.95}}]",
            "discount it twice",
        ),
    ],
)
def test_an_advantage_gamma_that_would_be_ignored_is_refused(tmp_path, override, fragment):
    """Invariant 6: episode mode never reads advantage.gamma_per_turn, so setting it is an error; nor may a
    turn mode discount the env_steps term's already discounted step rewards a second time."""
    with pytest.raises(ConfigError) as info:
        grpo_cfg(tmp_path, *override.split("|"))
    assert fragment in str(info.value)
