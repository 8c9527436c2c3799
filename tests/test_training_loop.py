"""The shared training loop with a toy objective (no LLM): accumulation, checkpoints, exact
resume (RNG, optimizer, schedule), metrics files and config validation."""

from __future__ import annotations

import pytest
import torch

from agentic_rl.training.checkpoint import latest_checkpoint
from agentic_rl.training.common import make_accelerator
from agentic_rl.training.loop import LoopConfig, OptimConfig, BatchObjective, run_training
from agentic_rl.training.metrics_file import read_metrics
from agentic_rl.training.run_dir import RunDir


class ToyObjective(BatchObjective):
    """Least squares on fresh random data each step, drawn from the GLOBAL torch RNG, so an
    exact resume needs the RNG state restored (accelerate's save_state does that)."""

    def __init__(self, micro_batch_size: int = 8, batch_size: int = 8, dtype: torch.dtype = torch.float32):
        self.micro_batch_size, self.batch_size = micro_batch_size, batch_size
        self.target = torch.arange(4, dtype=dtype)

    def bind(self, model, accelerator):
        self.model = model

    def next_batch(self, step):
        x = torch.randn(self.batch_size, 4, dtype=self.target.dtype)  # (B, 4)
        return x, x @ self.target + 0.1 * torch.randn(self.batch_size, dtype=self.target.dtype)

    def micro_batches(self, batch):
        x, y = batch
        m = self.micro_batch_size
        return [(x[i : i + m], y[i : i + m], self.batch_size) for i in range(0, len(x), m)]

    def loss(self, model, micro):
        x, y, total = micro
        loss = ((model(x).squeeze(-1) - y) ** 2).sum() / total  # this micro-batch's share of the batch mean
        return loss, {"sft/tokens": float(len(x))}  # rows stand in for tokens: a per-micro-batch count


def _train(out, steps, micro=8, checkpoint_every=0, objective=None, schedule="cosine", dtype=torch.float32):
    accelerator = make_accelerator("no", seed=0)
    model = torch.nn.Linear(4, 1).to(dtype)
    loop = LoopConfig(steps=steps, seed=0, output_dir=str(out), checkpoint_every=checkpoint_every, progress=False)
    optim = OptimConfig(lr=0.05, schedule=schedule, warmup_steps=2)
    run_dir = RunDir(out, loop, tensorboard=False)
    history = run_training(objective or ToyObjective(micro, dtype=dtype), model, loop, optim, accelerator, run_dir)
    return accelerator.unwrap_model(model), history


def test_accumulated_micro_batches_give_the_full_batch_update(tmp_path):
    """Guards against accumulation that averages micro-batch means (or forgets no_sync/zero_grad):
    1 × 8 and 4 × 2 micro-batches must give the same weights after several steps."""
    full, _ = _train(tmp_path / "a", steps=3, micro=8, dtype=torch.float64)  # float64: the same sum in another
    split, history = _train(tmp_path / "b", steps=3, micro=2, dtype=torch.float64)  # order, ~1e-16 apart on any CPU
    for p, q in zip(full.parameters(), split.parameters()):
        torch.testing.assert_close(p, q, atol=1e-12, rtol=0)
    assert history[0]["sft/tokens"] == 2.0  # metrics are averaged over micro-batches


def test_resume_restores_rng_optimizer_and_schedule_exactly(tmp_path):
    """Guards against resume that re-draws data with a fresh RNG, resets Adam moments or
    restarts the warm-up: an interrupted-and-resumed run must be bit-identical."""

    class Killed(Exception):
        pass

    straight, _ = _train(tmp_path / "straight", steps=6, checkpoint_every=2)

    class DiesAtStep3(ToyObjective):
        def next_batch(self, step):
            if step == 3:
                raise Killed()
            return super().next_batch(step)

    with pytest.raises(Killed):
        _train(tmp_path / "split", steps=6, checkpoint_every=2, objective=DiesAtStep3())
    assert latest_checkpoint(tmp_path / "split" / "checkpoints").name == "step-000002"
    torch.manual_seed(1234)  # a resumed process starts with whatever RNG state; the checkpoint must win
    resumed, history = _train(tmp_path / "split", steps=6, checkpoint_every=2)
    assert len(history) == 4
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    a, b = read_metrics(tmp_path / "straight" / "metrics.jsonl"), read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6], (
        "steps logged before the kill but after the checkpoint are dropped"
    )
    assert [r["loss/total"] for r in a] == [r["loss/total"] for r in b]
    assert [r["optim/lr"] for r in a] == [r["optim/lr"] for r in b]


def test_partial_checkpoints_are_never_resumed_and_old_ones_are_pruned(tmp_path):
    """Guards against resuming from a half-written checkpoint (a kill during save) and against
    checkpoints filling the disk."""
    _train(tmp_path, steps=6, checkpoint_every=1)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["step-000005", "step-000006"]  # keep_checkpoints=2
    (folder / ".tmp-step-000007").mkdir()
    (folder / "step-000008").mkdir()  # no trainer_state.pt: incomplete
    assert latest_checkpoint(folder).name == "step-000006"


def test_a_finished_run_relaunched_does_not_train_again(tmp_path):
    """Guards against a relaunch of a finished run training extra steps or duplicating metrics."""
    first, _ = _train(tmp_path, steps=3)
    again, history = _train(tmp_path, steps=3)
    assert history == []
    for p, q in zip(first.parameters(), again.parameters()):
        assert torch.equal(p, q)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_a_checkpoint_past_train_steps_is_refused_by_the_loop(tmp_path):
    """Guards against a step-3 checkpoint "resumed" by a 2-step run: no step runs, exit 0 (the
    trainers refuse it before loading anything; this is the loop's check of what it loaded)."""
    from agentic_rl.training.checkpoint import CheckpointError

    _train(tmp_path, steps=3)
    with pytest.raises(CheckpointError, match=r"step-000003 is at step 3, beyond train.steps=2"):
        _train(tmp_path, steps=2)


def test_a_run_killed_before_its_first_checkpoint_logs_each_step_once(tmp_path):
    """Guards against a rerun that starts over (no checkpoint yet) appending to the steps the
    killed run had logged: metrics.jsonl read 1, 1, 2, 3."""

    class Killed(Exception):
        pass

    class DiesAtStep1(ToyObjective):
        def next_batch(self, step):
            if step == 1:
                raise Killed()
            return super().next_batch(step)

    with pytest.raises(Killed):
        _train(tmp_path, steps=3, objective=DiesAtStep1())
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]
    _train(tmp_path, steps=3)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.parametrize(
    "make",
    [
        lambda: OptimConfig(lr=0),
        lambda: OptimConfig(betas=[0.9]),
        lambda: OptimConfig(warmup_steps=-1),
        lambda: LoopConfig(steps=-1),
        lambda: LoopConfig(keep_checkpoints=0),
    ],
)
def test_invalid_loop_and_optimizer_settings_are_rejected(make):
    """Guards against nonsense settings (zero LR, one beta) being accepted and silently misused."""
    with pytest.raises(ValueError):
        make()


def test_optimizer_is_fused_adamw_and_its_first_steps_follow_the_formula():
    """Two AdamW steps with weight decay, against the float64 formula written out by hand:
    m = b1·m + (1-b1)·g, v = b2·v + (1-b2)·g², p ← p·(1 - lr·wd) - lr·(m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)."""
    from agentic_rl.training.loop import build_optimizer

    model = torch.nn.Linear(3, 2)
    start = [p.detach().double().clone() for p in model.parameters()]
    cfg = OptimConfig(lr=0.1, weight_decay=0.5, betas=[0.8, 0.9], eps=1e-3)
    optimizer, _ = build_optimizer(model, cfg, total_steps=2)
    assert optimizer.defaults["fused"] is True  # one pass per parameter: benchmarks/optimizer_step.py
    grads = [
        [torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]]), torch.tensor([2.0, -0.25])],
        [torch.tensor([[-1.0, 1.0, 0.5], [4.0, 0.0, 1.0]]), torch.tensor([0.5, 0.5])],
    ]
    expected, m, v = start, [torch.zeros_like(p) for p in start], [torch.zeros_like(p) for p in start]
    for t, step_grads in enumerate(grads, start=1):
        for p, g in zip(model.parameters(), step_grads):
            p.grad = g.clone()
        optimizer.step()
        new = []
        for i, (p, g) in enumerate(zip(expected, step_grads)):
            g = g.double()
            m[i] = 0.8 * m[i] + 0.2 * g
            v[i] = 0.9 * v[i] + 0.1 * g * g
            update = (m[i] / (1 - 0.8**t)) / ((v[i] / (1 - 0.9**t)).sqrt() + 1e-3)
            new.append(p * (1 - 0.1 * 0.5) - 0.1 * update)
        expected = new
    for p, want in zip(model.parameters(), expected):
        torch.testing.assert_close(p.detach().double(), want, rtol=0, atol=1e-6)
