"""`backend: trl`: the same GRPOConfig, environments and reward terms, trained by TRL 1.16's GRPOTrainer.

    agentic-rl grpo [--config F] --set backend=trl          (every key: agentic-rl config grpo)

Two paths, chosen by the effective turn limit T = min(rollout.max_turns, the env's max_turns):

  * T == 1, single turn (any template, e.g. SmolLM2's ChatML, which has no tool role): the prompt is the
    env's reset messages rendered by OUR chat format (tools injected Hermes-style where the template has no
    `tools=`), passed to TRL as plain text, so TRL sees exactly the prompt tokens our engine builds. TRL
    decodes the completion; our env grades it (`env.step(text)`), our reward terms score it.
  * T > 1, multi-turn with tools (templates that render tool calls, e.g. Qwen3): TRL's
    `environment_factory` drives our env (see trl_adapters), `max_tool_calling_iterations = T - 1`,
    `generation_kwargs.max_new_tokens = rollout.max_turn_tokens` per generate call (= per turn), and
    `max_completion_length` = the episode budget left after the longest prompt. A template that cannot
    render tool calls raises (set rollout.max_turns: 1 for the single-turn path).

Mapping (ours -> TRL GRPOConfig); everything else raises (invariant 6). `CONFIG_MAPPING` is the table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from accelerate import PartialState
from peft import LoraConfig as PeftLoraConfig
from transformers import AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer
from trl.chat_template_utils import supports_tool_calling

from agentic_rl.integrations.trl_adapters import make_trl_dataset, make_trl_environment_factory, make_trl_reward_funcs
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.device import load_for_decoding, resolve_device
from agentic_rl.models.loader import TINY_QWEN3, resolve_model_path
from agentic_rl.models.stage_output import FINAL_DIR, read_stage_record, write_stage_record
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.training.run_dir import start_run

CONFIG_MAPPING: dict[str, str] = {
    "model.name": "model path (a built-in or `final/` folder is saved to output_dir/base_model first)",
    "model.dtype": "model_init_kwargs.dtype (policy and full-fine-tune reference)",
    "model.lora.*": "peft_config = peft.LoraConfig(r, lora_alpha, lora_dropout, target_modules); enabled=false: none",
    "model.gradient_checkpointing": "gradient_checkpointing",
    "env.name, env.options": "environment_factory (multi-turn) / reward grading env (single-turn)",
    "env.task_pool": "train_dataset = the first task_pool train tasks (seed = train.seed)",
    "env.mix": "not supported: raises when set (one env's options per TRL dataset and environment_factory)",
    "rewards[*]": "reward_funcs (one per term, named after it) + reward_weights",
    "rollout.batch_size": "generation_batch_size = B = P*G (via per_device_train_batch_size * gradient_accumulation_steps)",
    "rollout.group_size": "num_generations",
    "rollout.max_turn_tokens": "single-turn: max_completion_length; multi-turn: generation_kwargs.max_new_tokens (per turn)",
    "rollout.max_episode_tokens": "checked against prompt + completion; multi-turn: max_completion_length = it - longest prompt",
    "rollout.max_turns": "max_tool_calling_iterations = min(max_turns, env max_turns) - 1 (1: single-turn path)",
    "rollout.sampling: temperature, top_p, top_k": "temperature, top_p, top_k (0 = off in both)",
    "rollout.backend": "only 'auto'/'hf' (TRL decodes with transformers generate); 'fast' raises",
    "rollout.tool_workers": "only the default (TRL runs tool calls sequentially); other values raise",
    "rollout.enable_thinking": "chat_template_kwargs.enable_thinking (null: not passed) and our single-turn prompts",
    "rollout.device": "use_cpu = (it resolves to cpu); a built-in or `final/` base is merged there; cuda:N raises",
    "loss.loss_type": "loss_type ('token' -> 'dapo'; dr_grpo divides by TRL's max_completion_length, above)",
    "loss.scale_rewards": "scale_rewards",
    "loss.epsilon, epsilon_high": "epsilon, epsilon_high",
    "loss.beta": "beta",
    "loss.kl_importance_correction": "use_bias_correction_kl (set explicitly: TRL's default is True)",
    "loss.importance_sampling_level": "importance_sampling_level",
    "advantage.mode": "only 'episode' (TRL has no per-turn advantages); gamma must stay 1.0",
    "reward_model.*": "not supported: raises when path is set",
    "updates_per_batch": "num_iterations",
    "old_logprobs": "TRL re-scores pi_old when num_iterations > 1 (= 'recompute'); 'sampling' is exact only for mu = 1",
    "rollout_correction.*": "only mode off (TRL generates with the training weights: no sampler/trainer mismatch to correct)",
    "audit.on_start": "not run: TRL builds and trains its own batches (`agentic-rl audit` checks the model, template and env)",
    "micro_batch_size": "per_device_train_batch_size (must divide rollout.batch_size / processes)",
    "optim.lr, weight_decay, betas, eps": "learning_rate, weight_decay, adam_beta1/adam_beta2, adam_epsilon",
    "optim.schedule, warmup_steps": "lr_scheduler_type (constant -> constant_with_warmup), warmup_steps",
    "optim.max_grad_norm": "max_grad_norm (0 = no clipping in both)",
    "train.steps, seed, output_dir": "max_steps, seed + data_seed, output_dir",
    "train.checkpoint_every, keep_checkpoints": "save_strategy/save_steps ('no' for 0), save_total_limit",
    "train.resume": "resume_from_checkpoint = the newest checkpoint in output_dir, if any",
    "train.mixed_precision": "bf16 (fp16 always off)",
    "train.log_every, progress": "logging_steps, disable_tqdm",
    "(fixed)": "report_to=none, disable_dropout=False (ours keeps dropout), log_completions=False",
}


class TRLConfigError(ValueError):
    """A setting of our GRPOConfig that TRL's GRPOTrainer cannot honour."""


def _check_unmappable(cfg) -> None:
    errors = []
    defaults = RolloutConfig()
    if cfg.reward_model.path or cfg.reward_model.weight:
        errors.append(
            "reward_model: the learned reward term is not wired into the TRL backend; remove it or use backend: agentic_rl"
        )
    if cfg.env.mix:
        errors.append(
            "env.mix: the TRL backend builds its dataset and environment_factory from one set of env.options; "
            "remove the mix or use backend: agentic_rl"
        )
    if cfg.advantage.mode != "episode":
        errors.append(
            f"advantage.mode={cfg.advantage.mode}: TRL's GRPOTrainer has one advantage per completion; use mode: episode"
        )
    if cfg.advantage.gamma_per_turn != 1.0:
        errors.append(
            f"advantage.gamma_per_turn={cfg.advantage.gamma_per_turn}: only per-turn advantages discount; TRL has none"
        )
    if cfg.rollout.backend == "fast":
        errors.append("rollout.backend=fast: TRL decodes with transformers generate; use backend: auto or hf")
    if cfg.rollout.tool_workers != defaults.tool_workers:
        errors.append(f"rollout.tool_workers={cfg.rollout.tool_workers}: TRL runs tool calls one after another")
    if cfg.rollout.dtype != "float32":
        errors.append(f"rollout.dtype={cfg.rollout.dtype}: TRL generates with the training weights; use float32")
    if cfg.rollout.device.startswith("cuda:"):
        errors.append(
            f"rollout.device={cfg.rollout.device}: TRL puts the model on accelerate's device, one GPU per process; "
            "use auto, cuda or cpu and pick GPUs with CUDA_VISIBLE_DEVICES"
        )
    if cfg.rollout_correction.mode != "off":
        errors.append(
            f"rollout_correction.mode={cfg.rollout_correction.mode}: TRL generates with the training weights, "
            "so there is no sampler/trainer mismatch to correct; use mode: off"
        )
    if cfg.updates_per_batch > 1 and cfg.old_logprobs == "sampling":
        errors.append(
            "old_logprobs=sampling with updates_per_batch > 1: TRL re-scores pi_old with a forward pass; "
            "set old_logprobs: recompute"
        )
    if errors:
        raise TRLConfigError("backend: trl cannot honour these settings:\n  - " + "\n  - ".join(errors))


def _effective_max_turns(cfg) -> int:
    env = cfg.env.make()
    return min(cfg.rollout.max_turns, getattr(env, "max_turns", cfg.rollout.max_turns))


def _model_source(cfg, output_dir: Path) -> tuple[str, Any, str]:
    """(path TRL loads, tokenizer, base_name). Built-ins without a folder and `final/` folders are saved first."""
    name = cfg.model.name
    if name != TINY_QWEN3 and read_stage_record(name) is None:
        path = resolve_model_path(name)
        return path, AutoTokenizer.from_pretrained(path), name
    model, tokenizer, base_name = load_for_decoding(name, cfg.rollout.device)  # merged there, saved for TRL to load
    target = output_dir / "base_model"
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    # adapters trained here sit on the saved weights (a merged `final/`), or on the built-in by name
    return str(target), tokenizer, (base_name if name == TINY_QWEN3 else str(target))


def build_trl_trainer(cfg, callbacks: list | None = None, extra_args: dict[str, Any] | None = None):
    """(trainer, info): a TRL GRPOTrainer configured from our GRPOConfig `cfg` (`backend` is not read).

    `extra_args` are passed to TRL's GRPOConfig on top of the mapping (benchmarks use it for
    generation_kwargs such as min_new_tokens); they are not part of our config.
    """
    _check_unmappable(cfg)
    r, loss, optim, train = cfg.rollout, cfg.loss, cfg.optim, cfg.train
    device = resolve_device(r.device)  # a missing GPU stops here, before any model loads
    output_dir = Path(train.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_path, tokenizer, base_name = _model_source(cfg, output_dir)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"

    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if (r.batch_size // processes) % cfg.micro_batch_size or r.batch_size % processes:
        raise TRLConfigError(
            f"micro_batch_size={cfg.micro_batch_size} must divide rollout.batch_size / processes = {r.batch_size}/{processes}: "
            "TRL trains one generation batch of B = P*G as gradient_accumulation_steps micro-batches"
        )
    accumulation = r.batch_size // processes // cfg.micro_batch_size

    turns = _effective_max_turns(cfg)
    multi_turn = turns > 1
    env = cfg.env.make()
    chat = ChatFormat(tokenizer, enable_thinking=r.enable_thinking)
    if multi_turn:
        if not supports_tool_calling(tokenizer):
            raise TRLConfigError(
                f"rollout.max_turns={r.max_turns} needs TRL's multi-turn tool loop, but this tokenizer's chat template "
                "cannot render tool calls (e.g. SmolLM2's ChatML). Set rollout.max_turns: 1 for the single-turn path, "
                "or use backend: agentic_rl, whose chat format renders tools for any template"
            )
        dataset = make_trl_dataset(cfg.env.name, cfg.env.options, n=cfg.env.task_pool, seed=train.seed)
        longest_prompt = max(len(chat.prompt_ids(p, env.tool_schemas)) for p in dataset["prompt"])
        completion_budget = r.max_episode_tokens - longest_prompt
        if completion_budget < r.max_turn_tokens:
            raise TRLConfigError(
                f"rollout.max_episode_tokens={r.max_episode_tokens} leaves {completion_budget} tokens after "
                f"the longest prompt ({longest_prompt}), less than one turn (max_turn_tokens={r.max_turn_tokens})"
            )
        max_completion_length = completion_budget
        generation_kwargs = {"max_new_tokens": r.max_turn_tokens}
        environment_factory = make_trl_environment_factory(cfg.env.name, cfg.env.options)
    else:

        def render(env_, messages):
            return chat.render(messages, env_.tool_schemas, add_generation_prompt=True)

        dataset = make_trl_dataset(
            cfg.env.name, cfg.env.options, n=cfg.env.task_pool, seed=train.seed, prompt_fn=render
        )
        longest_prompt = max(len(chat.encode(p)) for p in dataset["prompt"])
        if longest_prompt + r.max_turn_tokens > r.max_episode_tokens:
            raise TRLConfigError(
                f"the longest prompt ({longest_prompt} tokens) + max_turn_tokens={r.max_turn_tokens} exceeds "
                f"max_episode_tokens={r.max_episode_tokens}: our engine would cut turns TRL does not cut"
            )
        max_completion_length = r.max_turn_tokens
        generation_kwargs = {}
        environment_factory = None

    funcs, weights = make_trl_reward_funcs(cfg.rewards, cfg.env.name, cfg.env.options)
    schedule = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[optim.schedule]
    args = dict(
        output_dir=str(output_dir),
        num_generations=r.group_size,
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=accumulation,
        max_completion_length=max_completion_length,
        temperature=r.sampling.temperature,
        top_p=r.sampling.top_p,
        top_k=r.sampling.top_k,
        generation_kwargs=generation_kwargs or None,
        max_tool_calling_iterations=(turns - 1) if multi_turn else None,
        beta=loss.beta,
        epsilon=loss.epsilon,
        epsilon_high=loss.epsilon_high,
        loss_type="dapo" if loss.loss_type == "token" else loss.loss_type,
        scale_rewards=loss.scale_rewards,
        importance_sampling_level=loss.importance_sampling_level,
        use_bias_correction_kl=loss.kl_importance_correction,
        num_iterations=cfg.updates_per_batch,
        reward_weights=weights,
        learning_rate=optim.lr,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps,
        lr_scheduler_type=schedule,
        warmup_steps=optim.warmup_steps,
        max_grad_norm=optim.max_grad_norm,
        max_steps=train.steps,
        seed=train.seed,
        data_seed=train.seed,
        save_strategy="steps" if train.checkpoint_every else "no",
        save_steps=train.checkpoint_every or 500,
        save_total_limit=train.keep_checkpoints,
        bf16=train.mixed_precision == "bf16",
        fp16=False,
        use_cpu=device.type == "cpu",
        model_init_kwargs={"dtype": cfg.model.dtype},
        chat_template_kwargs=None if r.enable_thinking is None else {"enable_thinking": r.enable_thinking},
        logging_steps=train.log_every,
        disable_tqdm=not train.progress,
        report_to="none",
        disable_dropout=False,
        log_completions=False,
    )
    if cfg.model.gradient_checkpointing:  # passed only when on: the key is deprecated (warns) in transformers 5.24
        args["gradient_checkpointing"] = True
    args.update(extra_args or {})
    trl_args = TRLGRPOConfig(**args)
    lora = cfg.model.lora
    peft_config = (
        PeftLoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
            bias="none",
        )
        if lora.enabled
        else None
    )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=funcs,
        args=trl_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        environment_factory=environment_factory,
        callbacks=callbacks,
    )
    if multi_turn:  # count policy tokens only: the tool-result tokens are exactly TRL's tool suffix ids
        funcs[0].grader.count_tool_tokens = lambda run: len(trainer._get_tool_suffix_ids(run))
    info = {
        "multi_turn": multi_turn,
        "max_turns": turns,
        "base_name": base_name,
        "model_path": model_path,
        "max_completion_length": max_completion_length,
    }
    return trainer, info


def train_grpo_trl(cfg) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer; returns {"final": folder, "history": TRL's log rows}."""
    run_dir = start_run("grpo", cfg, PartialState(), tensorboard=False)  # the one rule for a reused folder
    if run_dir.finished is not None:
        return run_dir.finished
    trainer, info = build_trl_trainer(cfg)
    output_dir = Path(cfg.train.output_dir)
    resume = get_last_checkpoint(str(output_dir)) if cfg.train.resume and output_dir.exists() else None
    trainer.train(resume_from_checkpoint=resume)
    final = output_dir / FINAL_DIR
    trainer.save_model(str(final))
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(str(final))
        write_stage_record(final, "lora" if cfg.model.lora.enabled else "full", info["base_name"])
    result = {"final": str(final), "history": list(trainer.state.log_history)}
    run_dir.finish(cfg.train.steps, result)
    run_dir.close()
    return result
