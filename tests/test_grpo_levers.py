"""The GRPO recipe levers on tiny-qwen3: dynamic sampling, the success-rate band, guided groups
(off-policy oracle demonstrations) and the entropy bonus. Each test fails when its lever is
switched off or broken."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from agentic_rl.rewards.base import list_rewards, register_reward
from test_grpo_trainer import _accumulated_gradient, _cfg, _first_batch

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
    common = ["rewards=[{name: parity_on_even_tasks}]", "rollout.batch_size=8", "rollout.group_size=2", "env.task_pool=16"]
    _, plain, batch = _first_batch(_cfg(tmp_path / "plain", *common))
    odd = {_task_index(t) % 2 for t in batch.trajectories}
    assert odd == {0, 1}, "the test needs a first draw with odd (zero-variance) tasks"
    assert batch.metrics["rollout/rounds"] == 1.0
    first_share = batch.metrics["rollout/groups_with_variance"]
    assert first_share < 1.0 and batch.metrics["train/groups_with_variance"] == first_share

    _, dynamic, batch = _first_batch(_cfg(tmp_path / "dynamic", *common, "selection.dynamic_sampling=true", "selection.max_rounds=4"))
    metrics = batch.metrics
    assert metrics["rollout/groups_with_variance"] < 1.0  # the same first draw (odd tasks), measured before replacing
    assert metrics["rollout/rounds"] > 1.0
    assert metrics["train/groups_with_variance"] == 1.0
    trajs = batch.trajectories
    assert len(trajs) == 8 and all(_task_index(t) % 2 == 0 for t in trajs)
    tasks = [t.task_id for t in trajs[::2]]
    assert len(set(tasks)) == 4 and all(trajs[2 * g].task_id == trajs[2 * g + 1].task_id for g in range(4))
    assert all(float(a) != 0.0 for a in batch.advantages)  # every episode now carries a gradient


def test_dynamic_sampling_stops_at_its_round_cap_and_keeps_the_batch_size(tmp_path):
    """All rewards equal (format only, a random model never answers): no round can help; the cost
    is capped at max_rounds extra rounds and the batch still holds every group."""
    cfg = _cfg(tmp_path, "rewards=[{name: format}]", "selection.dynamic_sampling=true", "selection.max_rounds=2")
    _, _, batch = _first_batch(cfg)
    assert batch.metrics["rollout/rounds"] == 3.0
    assert batch.metrics["train/groups_with_variance"] == 0.0
    assert len(batch.trajectories) == cfg.rollout.batch_size


def test_band_stops_drawing_prompts_whose_success_rate_lies_outside_it(tmp_path):
    _, objective, _ = _first_batch(_cfg(tmp_path, "selection.band=[0.1, 0.9]", "env.task_pool=8"))
    pool = objective.task_pool
    selector = objective.selector
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

    model, objective, batch = _first_batch(_cfg(tmp_path, "rewards=[{name: accuracy}]", "loss.beta=0", "guidance.enabled=true"))
    G = objective.cfg.rollout.group_size
    trajs = batch.trajectories
    assert not any(t.info.get("correct") for i, t in enumerate(trajs) if i % G != G - 1)  # the sampled members all fail
    assert batch.off_policy.tolist() == [i % G == G - 1 for i in range(len(trajs))]
    assert batch.metrics["train/guided_groups"] == len(trajs) // G
    chat_format = ChatFormat.for_tokenizer(objective.tokenizer)
    for row in range(G - 1, len(trajs), G):
        demo = trajs[row]
        task = next(t for t in objective.task_pool if t.id == demo.task_id)
        assert demo.input_ids == oracle_demos(objective.make_env(), [task], chat_format)[0].input_ids
        assert demo.info["correct"] and demo.reward == 1.0
        assert float(batch.advantages[row]) > 0 > float(batch.advantages[row - 1])
        assert demo.task_id == trajs[row - 1].task_id  # it joined its own prompt's group
    grads, micros = _accumulated_gradient(model, objective, batch)
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    _, metrics = objective.loss(model, micros[0])
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0)  # on-policy rows (μ = 1) and demo rows alike


def test_entropy_bonus_gives_a_gradient_where_every_advantage_is_zero(tmp_path):
    """Equal rewards: the surrogate has no gradient, so with the bonus every trained token must
    still move the adapters toward more entropy; and zero-advantage rows must not be skipped."""
    cfg = _cfg(tmp_path, "rewards=[{name: format}]", "loss.beta=0")
    model, objective, batch = _first_batch(cfg)
    assert float(batch.advantages.abs().max()) == 0.0
    assert objective.micro_batches(batch) == []  # without the bonus: nothing to train, every row skipped
    objective.cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, entropy_coef=0.01))
    grads, micros = _accumulated_gradient(model, objective, batch)
    assert sum(len(m.rows) for m in micros) == cfg.rollout.batch_size
    assert any(float(g.abs().max()) > 0 for g in grads.values())
    # Every advantage is 0, so the loss is the bonus alone: -c_H times the mean entropy (the
    # episodes all fill the same turn budget, so the per-sequence and the token mean agree).
    for micro in micros:
        loss, metrics = objective.loss(model, micro)
        assert float(loss) == pytest.approx(-0.01 * metrics["loss/entropy"] * micro.share, rel=1e-5)
