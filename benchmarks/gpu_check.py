"""The prepared GPU check: correctness, rollout throughput, GRPO against TRL and peak memory of the
Qwen3-0.6B setting, in one run of a few minutes, ending in one JSON line.

    python benchmarks/gpu_check.py --out gpu_check.json                  # on a GPU (under 8 min on an H200)
    python benchmarks/gpu_check.py --device cpu --tiny --out smoke.json  # CPU smoke run (tests/test_gpu_check.py)

Needs only what a bare GPU machine has: torch with CUDA, transformers, peft, accelerate (trl for the
GRPO comparison, which can travel as a wheel). Nothing is downloaded: the model is Qwen3-0.6B's
shape (hidden 1024, 28 layers, 16 heads, 8 KV heads, head dim 128, intermediate 3072,
vocabulary 151,936, tied embeddings, rope θ 1e6) with RANDOM weights and the vendored Qwen3
tokenizer, so every figure is about speed, memory and exactness, never accuracy.
--tiny swaps in a 2-layer, hidden-64 model of the same family.

Sections (each timed; one that fails records its error and the others still run):
  correctness  bf16 on CUDA (float32 on CPU): the engine's sampling log-probs against a training
               forward pass (sequence_logprobs) over multi-turn episodes, split into the first
               turn and later turns (those decode on the KV cache kept across tool observations);
               the loss mask is 1 exactly on policy spans.
  throughput   our engine against transformers `generate`, multi-turn arith episodes (3 turns of
               32 tokens, scripted calculator observations), at batch 64 and 256: generated tokens
               per second; `generate` re-encodes the conversation every turn (benchmarks/
               rollout_throughput.py's method, stop tokens off on both sides so counts match).
  grpo_step    seconds of one GRPO step, ours against TRL's GRPOTrainer, LoRA and full, same
               settings (4 prompts × G = 8, 128 new tokens, float32 weights with bf16 autocast on
               CUDA, β = 0.04), after one unmeasured warm-up step on each side.
  memory       peak GPU memory of configs/gsm8k-qwen3-0.6b.yaml's shapes: the rollout KV cache
               (128 episodes × 2,048 tokens, bf16) and one GRPO micro-batch (16 × 1,024 tokens,
               LoRA r = 32, bf16 weights, forward + backward + AdamW), to replace the
               computed figures (EXPERIMENTS.md, "Qwen3-0.6B on GSM8K").
  evaluation   `agentic-rl eval`'s path with rollout.device auto and rollout.dtype auto: tiny-qwen3
               loaded by models/device.py `load_for_decoding`, then a short greedy evaluation (arith,
               16 problems); the device the model sits on (cuda on a GPU machine: the check fails
               otherwise), the decode precision auto chose there, and the load and eval seconds.
The last line printed (and --out) is the JSON: {"device", "sections": {name: {...}}, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # rollout_throughput's helpers

QWEN3_0_6B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)


def build_model(tiny: bool, device: str, dtype: torch.dtype):
    """(model, tokenizer): a random-init Qwen3ForCausalLM of Qwen3-0.6B's (or the tiny) shape."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agentic_rl.models.loader import TINY_QWEN3, load_tokenizer

    tokenizer = load_tokenizer(TINY_QWEN3)
    config = Qwen3Config(
        vocab_size=151_936,
        max_position_embeddings=40_960,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **(TINY if tiny else QWEN3_0_6B),
    )
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the GPU: 0.6 B parameters take ~10 s on one CPU core
        model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(dtype).eval(), tokenizer


def check_correctness(model, tokenizer, args) -> dict:
    from rollout_throughput import _NoStopFormat, _tasks_and_envs

    from agentic_rl.models.logprobs import sequence_logprobs
    from agentic_rl.rollout.backend import RunnerBackend
    from agentic_rl.rollout.config import RolloutConfig
    from agentic_rl.rollout.engine import RolloutEngine
    from agentic_rl.rollout.factory import build_runner
    from agentic_rl.rollout.sampling import SamplingParams
    from agentic_rl.rollout.trajectory import collate

    episodes, turns, turn_tokens = (4, 3, 8) if args.tiny else (16, 3, 32)
    tasks, envs, _ = _tasks_and_envs(episodes, turns)
    limits = RolloutConfig(
        max_turn_tokens=turn_tokens, max_episode_tokens=2048, max_turns=turns, dtype=args.rollout_dtype
    )
    chat_format = _NoStopFormat(tokenizer)
    runner = build_runner(model, "auto", max_slots=episodes, max_len=2048, dtype=args.rollout_dtype)
    engine = RolloutEngine(
        RunnerBackend(runner, chat_format), chat_format, tokenizer, limits, SamplingParams(temperature=1.0, seed=0)
    )
    trajectories = engine.run(envs, tasks)
    batch = collate(trajectories, tokenizer.pad_token_id).to(args.device)
    with torch.no_grad():
        trained, _ = sequence_logprobs(model, batch.input_ids, batch.attention_mask, batch.loss_mask)  # (B, T)
    sampled = torch.tensor(
        [t.logprobs + [0.0] * (batch.input_ids.shape[1] - len(t)) for t in trajectories], device=args.device
    )  # (B, T)
    first_turn = torch.zeros_like(batch.loss_mask, dtype=torch.bool)  # (B, T)
    mask_errors = 0
    for row, traj in enumerate(trajectories):
        policy = [span for span in traj.spans if span.kind == "policy"]
        first_turn[row, policy[0].start : policy[0].end] = True
        expected = [0] * len(traj)
        for span in policy:
            expected[span.start : span.end] = [1] * (span.end - span.start)
        mask_errors += sum(a != b for a, b in zip(expected, traj.loss_mask))
    scored = batch.loss_mask.bool()
    diff = (trained.float() - sampled).abs()  # (B, T)
    later = scored & ~first_turn
    return {
        "episodes": episodes,
        "turns": [len([s for s in t.spans if s.kind == "policy"]) for t in trajectories][:4],
        "policy_tokens": int(scored.sum()),
        "max_abs_diff_first_turn": float(diff[scored & first_turn].max()),
        "max_abs_diff_later_turns": float(diff[later].max()) if later.any() else None,
        "mean_abs_diff": float(diff[scored].mean()),
        "mask_errors": mask_errors,
        "rollout_dtype": args.rollout_dtype,
    }


def check_throughput(model, tokenizer, args) -> dict:
    from rollout_throughput import _engine_run, _generate_episodes, _tasks_and_envs

    from agentic_rl.models.chat_format import ChatFormat

    batches, turns, turn_tokens = ((4, 8), 2, 8) if args.tiny else ((64, 256), 3, 32)
    options = types.SimpleNamespace(runner="fast", max_len=1024, temperature=1.0)
    chat_format = ChatFormat.for_tokenizer(tokenizer)
    result = {"turns": turns, "turn_tokens": turn_tokens}
    for batch in batches:
        tasks, envs, _ = _tasks_and_envs(batch, turns)
        tokens, seconds = _engine_run(model, tokenizer, options, envs, tasks, turn_tokens, turns, seed=0)
        _sync(args.device)
        result[f"engine_b{batch}_tok_s"] = tokens / seconds
        tasks, envs, _ = _tasks_and_envs(batch, turns)
        torch.manual_seed(0)
        tokens, seconds = _generate_episodes(model, tokenizer, chat_format, envs, tasks, turn_tokens, turns, 1.0)
        result[f"generate_b{batch}_tok_s"] = tokens / seconds
        result[f"engine_over_generate_b{batch}"] = result[f"engine_b{batch}_tok_s"] / result[f"generate_b{batch}_tok_s"]
    return result


def grpo_cfg(model_dir: str, setting: str, backend: str, args, out: str):
    from agentic_rl.algorithms.grpo import GRPOLossConfig
    from agentic_rl.models.lora import LoraConfig
    from agentic_rl.models.policy import ModelConfig
    from agentic_rl.rewards.base import RewardSpec
    from agentic_rl.training.episode_config import EnvConfig
    from agentic_rl.training.grpo_config import GRPOConfig, GRPORolloutConfig
    from agentic_rl.training.loop import LoopConfig, OptimConfig

    prompts, group, new_tokens = (2, 4, 8) if args.tiny else (4, 8, 128)
    return GRPOConfig(
        backend=backend,
        model=ModelConfig(name=model_dir, dtype="float32", lora=LoraConfig(enabled=setting == "lora")),
        env=EnvConfig(name="arith", options={"difficulty": 2, "max_turns": 1}, task_pool=64),
        rewards=[RewardSpec("accuracy")],
        rollout=GRPORolloutConfig(
            batch_size=prompts * group, group_size=group, max_turn_tokens=new_tokens, max_turns=1
        ),
        loss=GRPOLossConfig(beta=0.04),
        micro_batch_size=prompts * group,
        optim=OptimConfig(lr=1e-5 if setting == "full" else 1e-4),
        train=LoopConfig(
            steps=2,
            output_dir=out,
            progress=False,
            resume=False,
            mixed_precision="bf16" if args.device == "cuda" else "no",
        ),
    )


def check_grpo_step(model, tokenizer, args) -> dict:
    from grpo_step import StepTimer

    from agentic_rl.integrations.trl_backend import build_trl_trainer
    from agentic_rl.training.grpo import train_grpo

    result = {}
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = str(Path(scratch) / "model")
        model.float().save_pretrained(model_dir)  # float32 weights, bf16 autocast: TRL's usual setting
        model.to(args.dtype)
        tokenizer.save_pretrained(model_dir)
        for setting in ("lora", "full"):
            rows = train_grpo(grpo_cfg(model_dir, setting, "agentic_rl", args, f"{scratch}/ours-{setting}"))["history"]
            last = rows[-1]
            result[f"ours_{setting}_s"] = last["time/data"] + last["time/forward_backward"] + last["time/optimizer"]
            result[f"ours_{setting}_tokens"] = last["rollout/completion_tokens/mean"]
            if "trl" not in args.grpo_backends.split(","):
                continue
            timer = StepTimer()
            trainer, _ = build_trl_trainer(
                grpo_cfg(model_dir, setting, "trl", args, f"{scratch}/trl-{setting}"), callbacks=[timer]
            )
            trainer.train()
            lengths = [
                r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r
            ]
            result[f"trl_{setting}_s"] = timer.times[-1]
            result[f"trl_{setting}_tokens"] = lengths[-1]
            result[f"trl_over_ours_{setting}"] = result[f"trl_{setting}_s"] / result[f"ours_{setting}_s"]
            del trainer
    return result


def check_memory(model, tokenizer, args) -> dict:
    """Peak memory of the Qwen3-0.6B config's shapes (on CPU: the same code, no figures)."""
    from agentic_rl.models.logprobs import sequence_logprobs
    from agentic_rl.models.lora import LoraConfig, apply_lora
    from agentic_rl.rollout.factory import build_runner

    slots, cache_len, micro, tokens = (8, 256, 2, 64) if args.tiny else (128, 2048, 16, 1024)
    cuda = args.device == "cuda"
    before = _allocated(cuda)
    runner = build_runner(model, "auto", max_slots=slots, max_len=cache_len, dtype="bfloat16" if cuda else "float32")
    kv_gb = (_allocated(cuda) - before) / 2**30 if cuda else None
    del runner
    policy = apply_lora(model, LoraConfig(r=32, alpha=64))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, 151_000, (micro, tokens), device=args.device)  # (B, T)
    mask = torch.zeros_like(ids)
    mask[:, tokens // 2 :] = 1  # (B, T) the second half stands for the policy's tokens
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with torch.autocast(args.device, dtype=torch.bfloat16, enabled=cuda):
        logps, _ = sequence_logprobs(policy, ids, torch.ones_like(ids), mask)  # (B, T)
        loss = -(logps * mask).sum() / mask.sum()
    loss.backward()
    optimizer.step()
    peak_gb = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    policy.unload()  # the base model back, without adapters, for any later section
    return {
        "kv_cache_slots": slots,
        "kv_cache_len": cache_len,
        "kv_cache_gb": kv_gb,
        "train_micro_batch": micro,
        "train_tokens": tokens,
        "train_peak_gb": peak_gb,
        "train_loss": float(loss),
    }


def check_evaluation(model, tokenizer, args) -> dict:
    """The eval command's device path on this machine (the section's own tiny-qwen3, not `model`)."""
    from agentic_rl.evaluation.config import EvalConfig
    from agentic_rl.evaluation.runner import evaluate
    from agentic_rl.models.device import load_for_decoding
    from agentic_rl.models.precision import resolve_rollout_dtype
    from agentic_rl.rollout.config import RolloutConfig

    begun = time.perf_counter()
    policy, policy_tokenizer, _ = load_for_decoding("tiny-qwen3", "auto")
    device = next(policy.parameters()).device
    loaded_s = time.perf_counter() - begun
    cfg = EvalConfig(
        n=16, max_concurrent=16, rollout=RolloutConfig(max_turn_tokens=32, max_turns=2, device="auto", dtype="auto")
    )
    begun = time.perf_counter()
    result = evaluate(policy, policy_tokenizer, cfg, progress=False)
    _sync(args.device)
    eval_s = time.perf_counter() - begun
    print(
        f"# evaluation: tiny-qwen3 on {device}, decoded in {resolve_rollout_dtype('auto', device)}, "
        f"{cfg.n} greedy episodes in {eval_s:.2f} s",
        file=sys.stderr,
        flush=True,
    )
    if device.type != args.device:
        raise RuntimeError(f"rollout.device auto put the model on {device}, expected {args.device}")
    return {
        "model_device": str(device),
        "decode_dtype": resolve_rollout_dtype("auto", device),
        "problems": result["n"],
        "pass@1": result["pass@1"],
        "load_s": loaded_s,
        "eval_s": eval_s,
    }


def _allocated(cuda: bool) -> int:
    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    return 0


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


SECTIONS = {
    "correctness": check_correctness,
    "throughput": check_throughput,
    "evaluation": check_evaluation,
    "memory": check_memory,
    "grpo_step": check_grpo_step,
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where everything runs")
    parser.add_argument(
        "--tiny", action="store_true", help="a 2-layer, hidden-64 Qwen3 and small batches (the CPU smoke run)"
    )
    parser.add_argument("--out", default="", help="also write the JSON line to this file")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    parser.add_argument(
        "--grpo-backends",
        default="ours,trl",
        help="grpo_step's sides; the CPU smoke test runs ours only (TRL's tiny CPU step takes ~30 s)",
    )
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="skip the sections that would start after this many seconds"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda: torch sees no GPU (torch.cuda.is_available() is False); use --device cpu --tiny for the smoke run"
        )
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    args.rollout_dtype = "bfloat16" if args.device == "cuda" else "float32"
    started = time.perf_counter()
    model, tokenizer = build_model(args.tiny, args.device, args.dtype)
    report = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "tiny": args.tiny,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "date": time.strftime("%Y-%m-%d"),
        "build_s": time.perf_counter() - started,
        "sections": {},
    }
    for name in [s for s in args.sections.split(",") if s]:
        if time.perf_counter() - started > args.budget_s:
            report["sections"][name] = {"ok": False, "error": f"skipped: past the {args.budget_s:.0f} s budget"}
            continue
        begun = time.perf_counter()
        try:
            figures = {"ok": True, **SECTIONS[name](model, tokenizer, args)}
        except Exception as exc:  # noqa: BLE001 - one failing section must not hide the others
            figures = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        figures["seconds"] = time.perf_counter() - begun
        report["sections"][name] = figures
        print(f"# {name}: {json.dumps(figures)[:400]}", file=sys.stderr, flush=True)
    report["total_s"] = time.perf_counter() - started
    line = json.dumps(report)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)
    return report


if __name__ == "__main__":
    main()
