"""The GRPO recipe levers on tiny-qwen3: dynamic sampling, the success-rate band, guided groups
(off-policy oracle demonstrations), the entropy bonus and μ > 1 updates per rollout batch. Each
test fails when its lever is switched off or broken."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from helpers_training import accumulated_gradient, first_batch, grpo_cfg

from agentic_rl.rewards.base import list_rewards, register_reward

if "parity_on_even_tasks" not in list_rewards():

    @register_reward("parity_on_even_tasks")
    def parity_on_even_tasks(traj) -> float:
        """Test only: varies per sample on tasks with an even index, 0 on the others, so the groups
        of odd tasks never have reward variance."""
        if int(traj.task_id.rsplit("/", 1)[1]) % 2:
            return 0.0
        ids = [i for i, m in zip(traj.input_ids, traj.loss_mask) if m]
        return sum(i % 2 == 0 for i in ids) / max(1, len(ids))


def _task_index(traj) -> int:
    return int(traj.task_id.rsplit("/", 1)[1])


def test_dynamic_sampling_replaces_zero_variance_groups_with_fresh_prompts(tmp_path):
    """Guards against dynamic sampling that trains on zero-variance groups anyway (no gradient) or logs the
    share after replacing instead of before."""
    common = [
        "rewards=[{name: parity_on_even_tasks}]",
        "rollout.batch_size=8",
        "rollout.group_size=2",
        "env.task_pool=16",
    ]
    _, plain, batch = first_batch(grpo_cfg(tmp_path / "plain", *common))
    odd = {_task_index(t) % 2 for t in batch.trajectories}
    assert odd == {0, 1}, "the test needs a first draw with odd (zero-variance) tasks"
    assert batch.metrics["rollout/rounds"] == 1.0
    first_share = batch.metrics["rollout/groups_with_variance"]
    assert first_share < 1.0 and batch.metrics["train/groups_with_variance"] == first_share

    _, dynamic, batch = first_batch(
        grpo_cfg(tmp_path / "dynamic", *common, "selection.dynamic_sampling=true", "selection.max_rounds=4")
    )
    metrics = batch.metrics
    assert metrics["rollout/groups_with_variance"] < 1.0  # the same first draw (odd tasks), measured before replacing
    assert metrics["rollout/rounds"] > 1.0
    assert metrics["train/groups_with_variance"] == 1.0
    trajs = batch.trajectories
    assert len(trajs) == 8 and all(_task_index(t) % 2 == 0 for t in trajs)
    tasks = [t.task_id for t in trajs[::2]]
    assert len(set(tasks)) == 4 and all(trajs[2 * g].task_id == trajs[2 * g + 1].task_id for g in range(4))
    assert torch.equal(
        batch.advantages, batch.advantages[:, :1].expand_as(batch.advantages)
    )  # episode credit: one value per row
    assert all(float(a) != 0.0 for a in batch.advantages[:, 0])  # every episode now carries a gradient


def test_dynamic_sampling_stops_at_its_round_cap_and_keeps_the_batch_size(tmp_path):
    """All rewards equal (format only, a random model never answers): no round can help; the cost
    is capped at max_rounds extra rounds and the batch still holds every group."""
    cfg = grpo_cfg(tmp_path, "rewards=[{name: format}]", "selection.dynamic_sampling=true", "selection.max_rounds=2")
    _, _, batch = first_batch(cfg)
    assert batch.metrics["rollout/rounds"] == 3.0
    assert batch.metrics["train/groups_with_variance"] == 0.0
    assert len(batch.trajectories) == cfg.rollout.batch_size


def test_band_stops_drawing_prompts_whose_success_rate_lies_outside_it(tmp_path):
    """Guards against selection.band drawing prompts that are always or never solved, and against a band too
    narrow to fill a batch stalling the draw instead of falling back (and counting it)."""
    _, objective, _ = first_batch(grpo_cfg(tmp_path, "selection.band=[0.1, 0.9]", "env.task_pool=8"))
    pool = objective.sampler.task_pool
    selector = objective.sampler.selector
    selector.outcomes = {pool[0].id: (8, 8), pool[1].id: (0, 8), pool[2].id: (3, 8)}  # always, never, sometimes
    drawn = {t.id for seed in range(50) for t in selector.draw(random.Random(seed), 2)}
    assert pool[0].id not in drawn and pool[1].id not in drawn
    assert pool[2].id in drawn and drawn == {t.id for t in pool[2:]}
    selector.outcomes = {t.id: (8, 8) for t in pool[:7]}  # only one prompt left in the band: fall back, and count it
    selector.band_fallbacks = 0
    assert len(selector.draw(random.Random(0), 2)) == 2 and selector.band_fallbacks == 1


def test_guided_groups_put_the_oracle_demonstration_in_groups_that_all_fail(tmp_path):
    """A random model never answers correctly, so every group has advantage 0. With guidance the
    last member of each group is the env's oracle demonstration: correct, rewarded, with a positive
    advantage, trained with ratio 1 (π_old := sg(π_θ) on its tokens)."""
    from agentic_rl.models.chat_format import ChatFormat
    from agentic_rl.rollout.demos import oracle_demos

    model, objective, batch = first_batch(
        grpo_cfg(tmp_path, "rewards=[{name: accuracy}]", "loss.beta=0", "guidance.enabled=true")
    )
    G = objective.cfg.rollout.group_size
    trajs = batch.trajectories
    assert not any(t.info.get("correct") for i, t in enumerate(trajs) if i % G != G - 1)  # the sampled members all fail
    assert batch.off_policy.tolist() == [i % G == G - 1 for i in range(len(trajs))]
    assert batch.metrics["train/guided_groups"] == len(trajs) // G
    chat_format = ChatFormat.for_tokenizer(objective.sampler.tokenizer)
    for row in range(G - 1, len(trajs), G):
        demo = trajs[row]
        task = next(t for t in objective.sampler.task_pool if t.id == demo.task_id)
        assert demo.input_ids == oracle_demos(objective.sampler.env_for(task), [task], chat_format)[0].input_ids
        assert demo.info["correct"] and demo.reward == 1.0
        assert float(batch.advantages[row, 0]) > 0 > float(batch.advantages[row - 1, 0])
        assert demo.task_id == trajs[row - 1].task_id  # it joined its own prompt's group
    grads, micros = accumulated_gradient(model, objective, batch)
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    _, metrics = objective.loss(model, micros[0])
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0)  # on-policy rows (μ = 1) and demo rows alike


def test_entropy_bonus_gives_a_gradient_where_every_advantage_is_zero(tmp_path):
    """Equal rewards: the surrogate has no gradient, so with the bonus every trained token must
    still move the adapters toward more entropy; and zero-advantage rows must not be skipped."""
    cfg = grpo_cfg(tmp_path, "rewards=[{name: format}]", "loss.beta=0")
    model, objective, batch = first_batch(cfg)
    assert float(batch.advantages.abs().max()) == 0.0
    assert objective.micro_batches(batch) == []  # without the bonus: nothing to train, every row skipped
    objective.cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, entropy_coef=0.01))
    grads, micros = accumulated_gradient(model, objective, batch)
    assert sum(len(m.rows) for m in micros) == cfg.rollout.batch_size
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    # Every advantage is 0, so the loss is the bonus alone: -c_H times the mean entropy (the
    # episodes all fill the same turn budget, so the per-sequence and the token mean agree).
    for micro in micros:
        loss, metrics = objective.loss(model, micro)
        assert float(loss) == pytest.approx(-0.01 * metrics["loss/entropy"] * micro.share, rel=1e-5)


def _step_in_place(model, grads: dict[str, torch.Tensor], lr: float) -> None:
    """One plain SGD step on the adapters (the test's stand-in for the loop's optimizer)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in grads:
                param -= lr * grads[name]


def test_mu_two_trains_twice_on_one_rollout_batch_with_the_sampler_logprobs_as_pi_old(tmp_path):
    """μ = updates_per_batch = 2: the second optimizer step trains on the first step's rollouts, and
    π_old stays the sampler's log-probs, so once the weights have moved the ratio leaves 1 and the
    clip acts; the third step rolls out afresh with the new weights. Guards against rolling out
    again at every step (μ silently 1) and against π_old taken from the current weights (the
    ratio pinned at 1: the clip never acts, the trust region is gone)."""
    from helpers_references import reference_loss

    cfg = grpo_cfg(tmp_path, "updates_per_batch=2", "old_logprobs=sampling", "loss.beta=0", "loss.epsilon=0.01")
    model, objective, batch = first_batch(cfg)
    assert batch.old_logprobs is batch.tensors.logprobs  # the engine's, recorded while sampling
    grads, micros = accumulated_gradient(model, objective, batch)
    assert micros and all(
        objective.loss(model, m)[1]["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-4) for m in micros
    )
    _step_in_place(model, grads, lr=1.0)
    objective.sampler.sync_weights()  # the engine syncs the new weights (version 1)

    again = objective.batch_for(1)
    assert again is batch and again.staleness == 1
    moved = False
    for micro in objective.micro_batches(again):
        loss, metrics = objective.loss(model, micro)
        index = torch.tensor(micro.rows)
        t = again.tensors
        length = int(t.attention_mask[index].sum(-1).max())
        ids, attention, mask = (
            t.input_ids[index, :length],
            t.attention_mask[index, :length],
            t.loss_mask[index, :length],
        )
        with torch.no_grad():
            logps, _ = model(ids, attention, mask, cfg.rollout.sampling.temperature)  # π_θ after the update
        expected = (
            reference_loss(
                logps.double(),
                t.logprobs[index, :length].double(),
                again.advantages[index, 0].double(),
                mask,
                cfg.loss,
                None,
            )
            * micro.share
        )
        assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5, abs=1e-7)
        moved |= abs(metrics["loss/ratio_mean"] - 1.0) > 1e-3 and metrics["loss/clip_ratio_region"] > 0
    assert moved, "after one update the ratio against the sampler's log-probs must leave 1 and be clipped"
    objective.sampler.sync_weights()

    fresh = objective.batch_for(2)
    assert fresh is not batch and fresh.staleness == 0
    assert {t.weights_version for t in fresh.trajectories} == {objective.sampler.engine.weights_version}


def test_recomputed_pi_old_is_the_first_updates_own_forward_in_the_training_precision(
    tmp_path, fresh_accelerator_state, monkeypatch
):
    """old_logprobs: recompute under bf16 autocast: π_old is the first update's own forward (the
    weights that sampled the batch, in the precision the loss runs in), so that update's ratio is
    exactly 1, and the rows it trained keep those log-probs for the next update, whose ratio then
    moves with the weights. No separate re-scoring pass runs. Guards against π_old scored in fp32
    outside the loop's autocast, which put the fp32-bf16 gap (here 1.3e-3 nats per token on
    average, 3.5e-3 at most) into every ratio before any update; against a second update that
    reads π_θ again (its ratio stuck at 1: the clip never acts); and against the re-scoring pass
    (a forward over the whole batch, a third of an update's cost) coming back."""
    from agentic_rl.training import scoring

    passes = []
    original = scoring.sequence_logprobs

    def counting(*args, **kwargs):  # every forward of the trainer's model runs through it
        passes.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(scoring, "sequence_logprobs", counting)
    cfg = grpo_cfg(tmp_path, "updates_per_batch=2", "old_logprobs=recompute", "loss.beta=0", "micro_batch_size=4")
    model, objective, batch = first_batch(cfg, mixed_precision="bf16")
    assert passes == [], "π_old must come from the first update's forward, not a re-scoring pass"
    t, mask = batch.tensors, batch.tensors.loss_mask.bool()
    with torch.no_grad():
        with objective.accelerator.autocast():
            logps, _ = model(t.input_ids, t.attention_mask, t.loss_mask, cfg.rollout.sampling.temperature)
        fp32, _ = model(t.input_ids, t.attention_mask, t.loss_mask, cfg.rollout.sampling.temperature)
    gap = float((logps.float() - fp32)[mask].abs().mean())
    assert gap > 1e-4, "the test needs bf16 and fp32 log-probs that differ"
    rows = objective.rows_to_train(batch)
    assert rows and float(batch.old_logprobs.abs().sum()) == 0.0  # nothing recorded before the first update
    micros = objective.micro_batches(batch)
    with objective.accelerator.autocast():
        for micro in micros:
            _, metrics = objective.loss(model, micro)
            assert metrics["loss/ratio_mean"] == 1.0 and metrics["loss/clip_ratio_region"] == 0.0
    assert float(batch.old_logprobs.abs().sum()) == 0.0  # the loss reads the batch; it writes nothing into it
    objective.keep_first_forward(batch, micros)  # the step's line after the first update: π_old kept
    trained = mask[rows]
    assert trained.sum() > 0
    assert float((logps.float()[rows] - batch.old_logprobs[rows])[trained].abs().max()) < 1e-6 < gap
    recorded = batch.old_logprobs.clone()

    with torch.no_grad():  # an optimizer step's worth of change to the weights
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.05)
    objective.sampler.sync_weights()
    again = objective.batch_for(1)
    assert again is batch and again.staleness == 1
    with objective.accelerator.autocast():
        ratios = [objective.loss(model, micro)[1]["loss/ratio_mean"] for micro in objective.micro_batches(again)]
    assert max(abs(r - 1.0) for r in ratios) > 1e-3, "the second update must compare π_θ with the recorded π_old"
    assert torch.equal(batch.old_logprobs, recorded)  # the second update reads the record, never rewrites it


def test_a_run_resumed_between_the_updates_of_one_batch_keeps_its_recorded_pi_old(tmp_path, monkeypatch):
    """old_logprobs: recompute with μ = 2, stopped after the first update of a batch and resumed:
    the second update must read the π_old its batch's first update recorded (saved with the
    checkpoint), so the resumed run ends with the same adapters as an unbroken one, bit for bit.
    Guards against a checkpoint that keeps the batch but not its record (the resumed update would
    read 0s as π_old: ratio e^{log π_θ}, far from 1) and against a resumed update that records
    again from the weights it resumed with (ratio 1: no clip)."""
    from helpers_training import adapters
    from sigkill import interrupt_then_resume

    from agentic_rl.training.grpo import GRPO, train_grpo

    keys = ("updates_per_batch=2", "old_logprobs=recompute", "loss.beta=0", "train.steps=4", "train.checkpoint_every=1")
    train_grpo(grpo_cfg(tmp_path / "straight", *keys))
    resumed = interrupt_then_resume(monkeypatch, GRPO, train_grpo, grpo_cfg(tmp_path / "split", *keys), step=1)
    assert (
        resumed["history"][0]["rollout/staleness"] == 1.0
    )  # the first step after the resume is a batch's second update
    expected, got = adapters(tmp_path / "straight"), adapters(tmp_path / "split")
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
