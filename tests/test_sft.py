"""SFT trainer: masked NLL against a float64 hand computation, mask-0 tokens get no gradient,
LoRA parameter count, merged adapters, a tiny end-to-end run and exact resume (tiny-qwen3).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentic_rl.algorithms.sft import sft_loss
from agentic_rl.config import load_config
from agentic_rl.envs.base import make_env
from agentic_rl.envs.oracle import play_oracle
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.lora import LoraConfig, apply_lora, count_parameters
from agentic_rl.rollout.demos import DemoError, oracle_demos
from agentic_rl.rollout.trajectory import collate
from agentic_rl.training.metrics_file import read_metrics
from agentic_rl.training.scoring import TokenScorer
from agentic_rl.training.sft import SFTConfig, train_sft


def _demos(tokenizer, n: int = 2, difficulty: int = 2):
    env = make_env("arith", difficulty=difficulty)
    return oracle_demos(env, env.tasks("train", n=n, seed=0), ChatFormat.for_tokenizer(tokenizer)), tokenizer


def _sft_cfg(output_dir: Path, *extra: str) -> SFTConfig:
    return load_config(
        SFTConfig,
        None,
        overrides=[
            "model.name=tiny-qwen3",
            "model.lora.r=4",
            "optim.lr=1e-2",
            "batch_size=4",
            "micro_batch_size=2",
            "sources=[{kind: oracle, env: {name: arith, options: {difficulty: 1}}, n: 8}]",
            f"train.output_dir={output_dir}",
            "train.progress=false",
            *extra,
        ],
    )


def test_oracle_demo_is_the_oracle_conversation_and_an_unsolved_task_is_refused(qwen3_tokenizer):
    """Guards SFT against training on a demonstration the env did not grade correct: the demo
    is exactly the conversation `play_oracle` played, and an oracle that runs out of turns or
    answers wrong raises DemoError instead of becoming training data."""
    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    env = make_env("arith", difficulty=2)
    task = env.tasks("train", n=1, seed=0)[0]
    (demo,) = oracle_demos(env, [task], chat_format)
    assert demo.messages == play_oracle(env, task).conversation and demo.info["correct"]
    turns = env.oracle_actions(task)
    for broken in (turns[:-1], turns[:-1] + ["Final Answer: -1"]):
        env.oracle_actions = lambda _task, broken=broken: broken
        with pytest.raises(DemoError, match=f"the oracle of env 'arith' did not solve task {task.id}"):
            oracle_demos(env, [task], chat_format)


def test_sft_loss_equals_float64_hand_computation_over_policy_tokens_only(qwen3_tokenizer, new_tiny_qwen3):
    """Guards against a loss that counts prompt/tool tokens, is off by one position, or
    normalises by the wrong token count (the seed's mask bugs)."""
    demos, tokenizer = _demos(qwen3_tokenizer)
    model = new_tiny_qwen3().double()
    batch = collate(demos, tokenizer.pad_token_id)
    logps, _ = TokenScorer(model)(batch.input_ids, batch.attention_mask, batch.loss_mask)  # (B, T)
    count = float(batch.loss_mask.sum())
    loss = sft_loss(logps, batch.loss_mask, count)

    with torch.no_grad():
        expected_sum, expected_count = 0.0, 0
        for traj in demos:  # one plain, unpadded full forward per demo
            ids = torch.tensor([traj.input_ids])
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # (T, V)
            for t, masked in enumerate(traj.loss_mask):
                if masked:
                    expected_sum -= float(log_probs[t - 1, traj.input_ids[t]])
                    expected_count += 1
    assert expected_count == count
    assert expected_count < sum(len(d) for d in demos) / 2, "the demos must contain many mask-0 (prompt/tool) tokens"
    assert float(loss) == pytest.approx(expected_sum / expected_count, rel=1e-10, abs=1e-10)


def test_sft_gradient_reaches_only_positions_that_predict_policy_tokens(qwen3_tokenizer, new_tiny_qwen3):
    """Guards against tool output / prompt tokens being trained as targets (docs/design.md invariant 2):
    the loss gradient w.r.t. the final hidden state is nonzero exactly at positions t-1 whose
    next token t has mask 1, and exactly zero where the next token is prompt, tool or padding."""
    demos, tokenizer = _demos(qwen3_tokenizer)
    model = new_tiny_qwen3().double()
    calls = []

    def keep(module, inputs, output):
        output.retain_grad()
        calls.append(output)

    handle = model.model.norm.register_forward_hook(keep)
    batch = collate(demos, tokenizer.pad_token_id)
    logps, _ = TokenScorer(model)(batch.input_ids, batch.attention_mask, batch.loss_mask)
    sft_loss(logps, batch.loss_mask, float(batch.loss_mask.sum())).backward()
    handle.remove()
    hidden = calls[-1]  # positions P..T-1; the shared system prompt 0..P-1 ran once, in an earlier call
    prefix = batch.input_ids.shape[1] - hidden.shape[1]
    assert len(calls) == 2 and prefix > 100, "the demos share their system prompt, which must run once"
    grad_norm = hidden.grad.norm(dim=-1)  # (B, T-P)
    predicts_policy = torch.zeros(batch.input_ids.shape, dtype=torch.bool)  # (B, T)
    predicts_policy[:, :-1] = batch.loss_mask[:, 1:].bool()
    assert not bool(predicts_policy[:, :prefix].any())
    predicts_policy = predicts_policy[:, prefix:]
    assert bool((grad_norm[~predicts_policy] == 0).all()), "a position predicting a mask-0 token received gradient"
    assert bool((grad_norm[predicts_policy] > 0).all()), "a position predicting a policy token received no gradient"
    observation_tokens = sum(s.end - s.start for d in demos for s in d.spans if s.kind == "observation")
    assert observation_tokens > 0, "the demos must contain tool observations for this check to mean anything"


def test_lora_trains_r_times_din_plus_dout_parameters_per_adapted_matrix(new_tiny_qwen3):
    """Guards against adapters on the wrong layers or a missing target (trainable count drifts)."""
    model = new_tiny_qwen3()
    c = model.config
    r = 4
    q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = [
        (c.hidden_size, q_out),
        (c.hidden_size, kv_out),
        (c.hidden_size, kv_out),
        (q_out, c.hidden_size),
        (c.hidden_size, c.intermediate_size),
        (c.hidden_size, c.intermediate_size),
        (c.intermediate_size, c.hidden_size),
    ]
    expected = c.num_hidden_layers * sum(r * (d_in + d_out) for d_in, d_out in shapes)
    assert expected == 8192  # 2 layers x 4 x (128 + 96 + 96 + 128 + 192 + 192 + 192)
    trainable, total = count_parameters(apply_lora(model, LoraConfig(r=r)))
    assert trainable == expected
    assert total == sum(p.numel() for p in new_tiny_qwen3().parameters()) + expected


def test_adapters_are_applied_without_the_third_party_deprecation_warning(new_tiny_qwen3):
    """Guards against transformers' `is_gradient_checkpointing` FutureWarning (PEFT reads the attribute)
    printing on every training command: noise a user can do nothing about."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(new_tiny_qwen3(), LoraConfig(r=4))
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "run"
    cfg = _sft_cfg(out, "train.steps=3", "train.checkpoint_every=0")
    result = train_sft(cfg)
    return out, result


def test_sft_end_to_end_changes_adapters_and_writes_the_run_directory(sft_run):
    """Guards against a run that trains nothing (frozen adapters, zero loss mask) or writes an
    incomplete run directory."""
    out, result = sft_run
    history = result["history"]
    assert len(history) == 3
    for row in history:
        assert all(torch.isfinite(torch.tensor(v)) for k, v in row.items() if k != "optim/grad_norm"), row
        assert row["loss/total"] > 0 and row["sft/tokens"] > 0
    assert history[-1]["loss/total"] < history[0]["loss/total"], (
        "3 steps at lr 1e-2 should lower the loss on the same tiny demo set"
    )
    adapters = load_file(out / "final" / "adapter_model.safetensors")
    lora_b = [v for k, v in adapters.items() if "lora_B" in k]
    assert lora_b and all(float(v.abs().max()) > 0 for v in lora_b), "LoRA B starts at zero; it must have moved"
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert (out / "config.yaml").exists() and any((out / "tb").iterdir())
    assert (out / "final" / "agentic_rl_model.json").exists()


def test_merged_model_gives_the_same_logits_as_base_plus_adapters(sft_run, tmp_path, qwen3_tokenizer, new_tiny_qwen3):
    """Guards against merge_adapters writing the base weights, a wrong scale (alpha/r) or dropped
    modules: the merged standalone model must equal base + adapters."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentic_rl.models.stage_output import merge_adapters

    out, _ = sft_run
    merged_dir = merge_adapters(out / "final", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with_adapters = PeftModel.from_pretrained(new_tiny_qwen3(), out / "final").eval()
    base = new_tiny_qwen3()
    ids = torch.tensor([qwen3_tokenizer.encode("Maya has $48. She spends $12. How much is left?")])
    with torch.no_grad():
        expected = with_adapters(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        base_logits = base(input_ids=ids).logits
    assert float((expected - base_logits).abs().max()) > 1e-3, (
        "the adapters must change the logits for this test to mean anything"
    )
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


class _Killed(Exception):
    """Stands in for SIGKILL: raised inside the loop after a checkpoint was written."""


def test_sft_resume_after_interruption_gives_the_same_adapters(tmp_path, monkeypatch):
    """Guards against a resume that restarts the data order, loses the optimizer moments or
    the LR schedule: a run interrupted after its step-2 checkpoint and relaunched with the same
    config must end with exactly the adapters of an uninterrupted 4-step run."""
    from agentic_rl.training.sft import SFTObjective

    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("train.steps=4", "train.checkpoint_every=2", "optim.schedule=linear", "optim.warmup_steps=1")
    train_sft(_sft_cfg(straight, *common))

    original = SFTObjective.next_batch

    def dies_at_step_2(self, step):
        if step == 2:
            raise _Killed()
        return original(self, step)

    monkeypatch.setattr(SFTObjective, "next_batch", dies_at_step_2)
    with pytest.raises(_Killed):
        train_sft(_sft_cfg(split, *common))
    monkeypatch.setattr(SFTObjective, "next_batch", original)
    assert (split / "checkpoints" / "step-000002" / "trainer_state.pt").exists()
    result = train_sft(_sft_cfg(split, *common))
    assert len(result["history"]) == 2, "the relaunch must resume at step 2, not start over"
    a = load_file(straight / "final" / "adapter_model.safetensors")
    b = load_file(split / "final" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert [r["step"] for r in read_metrics(split / "metrics.jsonl")] == [1, 2, 3, 4]
    assert (
        read_metrics(split / "metrics.jsonl")[-1]["loss/total"]
        == read_metrics(straight / "metrics.jsonl")[-1]["loss/total"]
    )


def test_adapters_trained_on_a_previous_stage_reload_on_top_of_that_stage(tmp_path, tiny_qwen3):
    """Guards against GRPO adapters recorded as sitting on the base model while they were trained
    on the merged SFT model: reloading them silently dropped the SFT weights (demo accuracy fell to 0)."""
    import json

    import torch

    from agentic_rl.models.lora import LoraConfig
    from agentic_rl.models.policy import ModelConfig, load_policy
    from agentic_rl.models.stage_output import load_base_and_tokenizer, read_stage_record, save_final

    class _Accelerator:
        is_main_process = True

        def wait_for_everyone(self):
            pass

        def unwrap_model(self, model):
            return model

    def train_one_stage(start: str, folder, seed: int) -> str:
        policy, tokenizer, recorded = load_policy(
            ModelConfig(name=start, lora=LoraConfig(r=2, alpha=2.0)), log=lambda _: None
        )
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
        return str(save_final(policy, tokenizer, folder, recorded, _Accelerator())), policy

    first, first_policy = train_one_stage("tiny-qwen3", tmp_path / "sft", 0)
    second, second_policy = train_one_stage(first, tmp_path / "grpo", 1)
    assert json.loads((tmp_path / "grpo" / "final" / "agentic_rl_model.json").read_text())["base"] == "../../sft/final"
    assert read_stage_record(second)["base"] == first  # read against the record's own folder
    ids = torch.tensor([[9707, 1879, 151645]])
    reloaded, _, root = load_base_and_tokenizer(second, "float32")
    assert root == "tiny-qwen3"
    with torch.no_grad():
        expected = second_policy(input_ids=ids).logits
        assert torch.allclose(reloaded(input_ids=ids).logits, expected, atol=1e-4)
        base, _ = tiny_qwen3
        assert not torch.allclose(base(input_ids=ids).logits, expected, atol=1e-3)


@pytest.mark.parametrize("normaliser", ["step", "dataset"])
def test_the_normaliser_decides_how_much_a_short_completion_weighs(qwen3_tokenizer, normaliser):
    """normaliser on memory's demonstrations, where `Next.` (3 trained tokens with the end of
    turn) sits beside tool calls of ~25 and length bucketing puts the `Next.` ones in steps of
    their own. dataset: every trained token of an epoch weighs exactly 1 / (batch_size x mean
    trained tokens). step: a step is its own token mean, so a `Next.` token weighs more than a
    tool-call token; under it memory's SFT put 1.7% on storing an asked fact, 6.7% under dataset
    (EXPERIMENTS.md, session 13)."""
    from types import SimpleNamespace

    from agentic_rl.envs.base import EnvSpec
    from agentic_rl.training.sft import DemoSource, SFTObjective, build_demos

    demos = build_demos(
        [DemoSource(env=EnvSpec("memory", {"facts": 1, "distractors": 4, "gap": 2, "window": 2}), n=8)],
        qwen3_tokenizer,
        0,
    )
    cfg = SFTConfig(batch_size=4, micro_batch_size=4, normaliser=normaliser)
    objective = SFTObjective(demos, cfg, pad_id=0)
    objective.bind(None, SimpleNamespace(num_processes=1, process_index=0))
    mean_tokens = sum(d.num_policy_tokens for d in demos) / len(demos)
    weight = {}  # id(demo) -> weight of each of its trained tokens in the epoch's loss
    steps = -(-len(demos) // 4)
    for step in range(steps):
        batch = objective.next_batch(step)
        for demo in batch["trajectories"]:
            weight[id(demo)] = 1 / batch["normaliser"]
    assert len(weight) == len(demos)  # one epoch sees every demonstration once
    short = [weight[id(d)] for d in demos if d.num_policy_tokens <= 3]
    long = [weight[id(d)] for d in demos if d.num_policy_tokens >= 20]
    assert short and long
    if normaliser == "dataset":
        assert set(weight.values()) == {1 / (4 * mean_tokens)}
    else:
        assert sum(short) / len(short) > 3 * sum(long) / len(long)
    with pytest.raises(ValueError, match=r"SFTConfig: 'normaliser' must be one of \['step', 'dataset'\], got 'tokens'"):
        SFTConfig(normaliser="tokens")


def test_merge_and_eval_refuse_a_stage_output_with_a_non_finite_weight(sft_run, tmp_path, capsys):
    """Guards against NaN adapters leaving the run: `merge` wrote a NaN model and `eval` reported
    accuracy 0, both exit 0. Every load of a stage output (models/stage_output.py) refuses it."""
    import shutil

    from safetensors.torch import save_file

    from agentic_rl import cli

    final = tmp_path / "final"
    shutil.copytree(sft_run[0] / "final", final)
    adapters = load_file(final / "adapter_model.safetensors")
    name = sorted(key for key in adapters if "lora_B" in key)[0]
    adapters[name][0, 0] = float("nan")
    save_file(adapters, final / "adapter_model.safetensors")
    assert cli.main(["merge", "--adapters", str(final), "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err
    assert f"'{final}': its weight " in err and "is not finite" in err and not any((tmp_path / "merged").iterdir())
    assert (
        cli.main(["eval", "--model", str(final), "--env", "arith", "--n", "2", "--out", str(tmp_path / "eval.json")])
        == 2
    )
    assert "is not finite" in capsys.readouterr().err and not (tmp_path / "eval.json").exists()
