"""`agentic-rl audit` passes on sound setups and fails, naming the first bad token, on broken ones."""

import copy
import dataclasses
import subprocess
import sys

import pytest

from agentic_rl.config import load_config
from agentic_rl.envs.base import make_env
from agentic_rl.evaluation.audit import check_masks, check_template, mask_problem, run_audit
from agentic_rl.evaluation.config import AuditConfig
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.rollout.demos import oracle_demos


def _cfg(model="tiny-qwen3", *overrides):
    return load_config(AuditConfig, None, [f"model={model}", "n=3", "env.options={difficulty: 2}", *overrides])


def test_every_check_passes_on_tiny_qwen3(tiny_qwen3):
    """Guards against an audit that fails a healthy model: template, mask, log-prob (float32 and bf16) and
    weight checks all pass on tiny-qwen3."""
    model, tokenizer = tiny_qwen3
    results = run_audit(model, tokenizer, _cfg("tiny-qwen3", "dtypes=[float32, bfloat16]"))
    assert [(r.name, r.passed) for r in results] == [
        ("template", True),
        ("mask", True),
        ("logprobs", True),
        ("weights", True),
    ]
    assert "float32 decode: max" in results[2].summary and "bfloat16 decode" in results[2].summary


@pytest.mark.parametrize("fast", [False, True])
def test_the_default_audits_bfloat16_decoding_only_where_bf16_is_fast(tiny_qwen3, monkeypatch, fast):
    """Guards against an audit that spends minutes in bf16's scalar fallback on an AVX2-only CPU,
    or one that stops checking bf16 decoding where the runs use it."""
    from agentic_rl.models import precision

    monkeypatch.setattr(precision, "mkldnn_linear_works", lambda dtype: fast)
    model, tokenizer = tiny_qwen3
    summary = run_audit(model, tokenizer, _cfg())[2].summary  # dtypes: [float32, auto]
    assert "float32 decode: max" in summary and ("bfloat16 decode" in summary) == fast


def test_a_template_that_rewrites_earlier_turns_fails_at_its_first_differing_token(qwen3_tokenizer):
    """Guards the template check: a template whose system line counts the messages re-renders every
    earlier turn differently, so incrementally built episodes would not match a re-rendering."""
    broken = copy.deepcopy(qwen3_tokenizer)
    broken.chat_template = "{{ messages | length }} messages\n" + broken.chat_template
    result = check_template(ChatFormat.for_tokenizer(broken), _cfg())
    assert not result.passed
    assert "first differing token at position 0" in result.summary
    assert any("<-- first difference" in line for line in result.detail)
    assert check_template(ChatFormat.for_tokenizer(qwen3_tokenizer), _cfg()).passed


@pytest.mark.parametrize("thinking", [None, False, True])
def test_the_template_check_passes_qwen3_with_every_thinking_setting(qwen3_tokenizer, thinking):
    """Guards against a false failure with enable_thinking false: the policy sees an empty think
    block after each generation prompt, which a re-render drops from the turns it writes (the
    engine allows for it); the check failed every multi-turn oracle episode at that block."""
    setting = [] if thinking is None else [f"rollout.enable_thinking={str(thinking).lower()}"]
    result = check_template(ChatFormat.for_tokenizer(qwen3_tokenizer, thinking), _cfg("tiny-qwen3", *setting))
    assert result.passed, (result.summary, result.detail)
    assert "9 turn boundaries" in result.summary  # 3 oracle episodes of difficulty 2: multi-turn


def _demo(tokenizer):
    env = make_env("arith", difficulty=2)
    (demo,) = oracle_demos(env, env.tasks("test", n=1, seed=0), ChatFormat.for_tokenizer(tokenizer))
    return demo


@pytest.mark.parametrize("shift", [1, -1])
def test_a_mask_shifted_by_one_fails_at_the_first_bad_token(qwen3_tokenizer, shift):
    """Guards the mask check: a loss mask one token off trains an observation token and leaves a
    model token out; the check names the first token where mask and model turn disagree."""
    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    demo = _demo(qwen3_tokenizer)
    assert mask_problem(chat_format, demo) is None and len(demo.policy_spans) >= 2
    first = demo.policy_spans[0].start
    mask = [0] + demo.loss_mask[:-1] if shift > 0 else demo.loss_mask[1:] + [0]
    shifted = dataclasses.replace(demo, loss_mask=mask)
    sequence, position, message = mask_problem(chat_format, shifted)
    assert (
        sequence == 0 and position == first + shift
    )  # right: the turn's first token lost its 1 / left: one token early
    assert "has mask 1 but is not the model's text" in message or "stops before the turn does" in message
    result = check_masks(chat_format, [demo, shifted])
    assert not result.passed and any("<-- first bad token" in line for line in result.detail)


def _memory_demo(tokenizer):
    env = make_env("memory", facts=2, distractors=4, gap=2, window=2)
    (demo,) = oracle_demos(env, env.tasks("test", n=1, seed=0), ChatFormat.for_tokenizer(tokenizer))
    return demo


def test_the_mask_check_reads_every_token_sequence_of_a_non_prefix_episode(qwen3_tokenizer):
    """An episode whose env drops old turns has several token sequences; together, oldest first,
    their masks are the episode's turns. Guards against the check reading only the last sequence
    (it failed every memory episode), and against it missing a bad mask in an earlier sequence or
    a lost sequence."""
    chat_format = ChatFormat.for_tokenizer(qwen3_tokenizer)
    demo = _memory_demo(qwen3_tokenizer)
    assert len(demo.previous) >= 2, "the window must have dropped turns more than once"
    assert mask_problem(chat_format, demo) is None
    first = demo.previous[1]
    start = first.policy_spans[0].start
    broken = dataclasses.replace(first, loss_mask=[0] + first.loss_mask[:-1])  # one token late
    shifted = dataclasses.replace(demo, previous=[demo.previous[0], broken, *demo.previous[2:]])
    sequence, position, message = mask_problem(chat_format, shifted)
    assert (sequence, position) == (1, start + 1) and "has mask 1 but is not the model's text" in message
    result = check_masks(chat_format, [demo, shifted])
    assert not result.passed and "token sequence 1" in result.summary
    turns = sum(1 for m in demo.messages if m["role"] == "assistant")
    lost_turns = len(demo.previous[0].policy_spans)
    lost = dataclasses.replace(
        demo, previous=demo.previous[1:], turn_rewards=demo.turn_rewards[lost_turns:]
    )  # its rewards go too
    assert mask_problem(chat_format, lost)[2] == f"{turns - lost_turns} masked runs for {turns} assistant turns"


def test_every_check_passes_on_the_memory_env_and_counts_every_sequence(tiny_qwen3):
    """Guards against an audit that only understands prefix episodes: the memory env's several token sequences
    per episode pass and are counted."""
    model, tokenizer = tiny_qwen3
    cfg = load_config(AuditConfig, None, ["model=tiny-qwen3", "n=2", "env.name=memory", "dtypes=[float32]"])
    results = run_audit(model, tokenizer, cfg)
    assert [(r.name, r.passed) for r in results] == [
        ("template", True),
        ("mask", True),
        ("logprobs", True),
        ("weights", True),
    ]
    assert "token sequences" in results[1].summary


def test_the_cli_exits_1_on_a_failure_and_prints_the_report(tmp_path):
    """Guards against a failing audit that exits 0: `agentic-rl audit` with an impossible tolerance exits 1,
    prints PASS/FAIL lines and a JSON verdict."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentic_rl.cli",
            "audit",
            "--model",
            "tiny-qwen3",
            "--n",
            "2",
            "--option",
            "difficulty=1",
            "--set",
            "dtypes=[float32]",
            "--tolerance",
            "1e-12",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "FAIL  logprobs" in done.stdout and "PASS  template" in done.stdout
    assert '"passed": false' in done.stdout.splitlines()[-1]


@pytest.mark.slow
def test_every_check_passes_on_the_embedded_model_with_arith():
    """Guards against a template, mask or log-prob mismatch on the real SmolLM2 chat template, which
    tiny-qwen3's tokenizer cannot reveal."""
    from agentic_rl.models.stage_output import load_base_and_tokenizer

    model, tokenizer, _ = load_base_and_tokenizer("smollm2-135m-instruct", "float32")
    results = run_audit(model, tokenizer, _cfg("smollm2-135m-instruct"))
    assert all(r.passed for r in results), [(r.name, r.summary, r.detail) for r in results if not r.passed]
