"""SFT with LoRA (or full fine-tuning) on demonstration Trajectories.

    agentic-rl sft [--config F] [--set train.steps=50]      (every key: agentic-rl config sft)

The loss is −Σ log P(y|x) over policy tokens only (algorithms/sft.py), divided by the number of
trained tokens in the optimizer step (normaliser: step), or by one constant, batch_size x
the mean trained tokens per demonstration (dataset), which weighs every token alike. Batches are
drawn by length bucketing: demonstrations are sorted by length, cut into batches of similar
length, and the batch order is shuffled per epoch from the seed, so padding stays small on CPU
and the order is a pure function of (seed, step): resume needs no data cursor beyond the step.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from agentic_rl.algorithms.sft import sft_loss
from agentic_rl.config import Config, NonNegativeInt, PositiveFloat, PositiveInt, refuse_unused
from agentic_rl.envs.base import EnvSpec, has_oracle, no_oracle_error
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.policy import ModelConfig, context_length, load_policy
from agentic_rl.models.stage_output import load_stage_tokenizer, save_final
from agentic_rl.plugins import PluginsConfig
from agentic_rl.rollout.config import TemplateOptions
from agentic_rl.rollout.demos import cap_repeats, check_length, demo_sequences, load_jsonl_demos, oracle_demos
from agentic_rl.rollout.trajectory import Trajectory, collate
from agentic_rl.training.common import make_accelerator
from agentic_rl.training.loop import BatchObjective, LoopConfig, OptimConfig, run_training
from agentic_rl.training.run_dir import start_run
from agentic_rl.training.scoring import TokenScorer, full_policy_state_dict, unwrap_policy


@dataclasses.dataclass
class DemoSource(Config):
    """Where demonstrations come from."""

    kind: Literal["oracle", "jsonl"] = "oracle"
    """oracle: the env's scripted solver through the env API (arith solver, GSM8K annotations);
    jsonl: a file of chat conversations, one per line (docs/sft-data.md)."""
    env: EnvSpec = dataclasses.field(default_factory=EnvSpec)
    """Environment for kind=oracle, with its options (e.g. {name: arith, options: {difficulty: [1, 2]}})."""
    split: Literal["train", "test"] = "train"
    """Task split for kind=oracle (keep test for evaluation)."""
    n: PositiveInt = 64
    """Number of oracle episodes for kind=oracle. An episode whose env changes the context (memory's
    window) gives one demonstration per token sequence, each with the context the policy saw."""
    path: str = ""
    """The JSONL file for kind=jsonl."""
    max_repeats: PositiveInt | None = None
    """Keep at most this many of the source's demonstrations whose trained tokens are identical
    (memory's `Next.`, the oracle's reply to every distractor), drawn by the seed; the log says how
    many were dropped. None keeps every one. Without it a majority action can be all SFT learns."""
    max_tokens: PositiveInt | None = None
    """The longest demonstration (token sequence) this source may hold; a longer one stops the run,
    naming its file and line (or task), never cut or dropped. None: the model's context
    (max_position_embeddings), which always applies."""

    def __post_init__(self) -> None:
        if self.kind == "jsonl" and not self.path:
            raise ValueError("sft.sources[].path is required when kind is jsonl")
        if self.kind == "jsonl":
            unused, used_with = ["env", "split", "n"], "sft.sources[].kind: oracle"
        else:
            unused, used_with = ["path"], "sft.sources[].kind: jsonl"
        refuse_unused(self, unused, prefix="sft.sources[].", used_with=used_with, now=f"kind is {self.kind!r}")

    def check(self) -> None:
        """An oracle source replays the env's oracle: the env must have one (the validation step)."""
        if self.kind == "oracle" and has_oracle(self.env.name) is False:
            raise no_oracle_error(
                self.env.name, "sft.sources[].kind: oracle", "give demonstrations of your own (kind: jsonl, path: FILE)"
            )


@dataclasses.dataclass
class SFTLoopConfig(LoopConfig):
    """`agentic-rl sft`'s loop: LoopConfig with this command's own defaults."""

    steps: NonNegativeInt = 25
    output_dir: str = "runs/sft"


@dataclasses.dataclass
class SFTOptimConfig(OptimConfig):
    """`agentic-rl sft`'s optimizer: OptimConfig with this command's own learning rate."""

    lr: PositiveFloat = 3e-4


@dataclasses.dataclass
class SFTConfig(PluginsConfig, TemplateOptions):
    """`agentic-rl sft`: supervised fine-tuning on demonstrations (enable_thinking: how they render)."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {"batch": "the top-level keys batch_size, micro_batch_size and normaliser"}

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The model and its adapters."""
    sources: list[DemoSource] = dataclasses.field(default_factory=lambda: [DemoSource()])
    """Demonstration sources, concatenated."""
    batch_size: PositiveInt = 8
    """Demonstrations per optimizer step (over all processes)."""
    micro_batch_size: PositiveInt = 8
    """Demonstrations per forward/backward on each process; gradients accumulate up to batch_size."""
    normaliser: Literal["step", "dataset"] = "step"
    """What the summed token loss of a step is divided by. step: the step's trained tokens, so each
    step is its own token mean, and a token in a step of short completions weighs more (batches
    are length-bucketed, so short completions, e.g. memory's `Next.`, share steps: there each one
    weighs ~5x a long one's). dataset: batch_size x the mean trained tokens per demonstration, one
    constant, so every trained token weighs the same in whichever step it lands."""
    optim: SFTOptimConfig = dataclasses.field(default_factory=SFTOptimConfig)
    """Optimizer."""
    train: SFTLoopConfig = dataclasses.field(default_factory=SFTLoopConfig)
    """Loop, output and checkpoints."""


def build_demos(
    sources: list[DemoSource],
    tokenizer: Any,
    seed: int,
    log=print,
    context: int | None = None,
    enable_thinking: bool | None = None,
) -> list[Trajectory]:
    """Every source's demonstrations, in order. context: the model's max_position_embeddings (None:
    unknown); no demonstration may be longer than it or than its source's max_tokens.
    enable_thinking: the chat template's switch (TemplateOptions), as the rollouts render."""
    chat_format = ChatFormat.for_tokenizer(tokenizer, enable_thinking)
    demos: list[Trajectory] = []
    for number, source in enumerate(sources):
        limit, limit_name = context, f"the model's context, max_position_embeddings={context}"
        if source.max_tokens is not None and (context is None or source.max_tokens < context):
            limit, limit_name = source.max_tokens, f"sft.sources[{number}].max_tokens"
        if source.kind == "jsonl":
            found = load_jsonl_demos(source.path, chat_format, limit, limit_name)
        else:
            env = source.env.make()
            tasks = env.tasks(source.split, n=source.n, seed=seed)
            found = demo_sequences(oracle_demos(env, tasks, chat_format))  # one example per token sequence
            for demo in found:
                check_length(demo, limit, f"sft.sources[{number}] (env {env.name}, task {demo.task_id})", limit_name)
        if source.max_repeats is not None:
            kept, dropped = cap_repeats(found, source.max_repeats, seed + number)
            for tokens, count in sorted(dropped.items(), key=lambda item: -item[1]):
                log(
                    f"sft.sources[{number}]: dropped {count} of {count + source.max_repeats} demonstrations "
                    f"training exactly {tokenizer.decode(list(tokens))!r} (max_repeats={source.max_repeats})"
                )
            found = kept
        demos.extend(found)
    return demos


def length_bucketed_batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped into batches of similar length; batch order shuffled per (seed, epoch).

    The last batch of the sorted order may be short; it is kept (nothing is dropped).
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed * 1_000_003 + epoch).shuffle(batches)
    return batches


class SFTObjective(BatchObjective):
    """Masked NLL over demonstration batches (see module docstring)."""

    def __init__(self, demos: list[Trajectory], cfg: SFTConfig, pad_id: int):
        self.demos = demos
        self.cfg = cfg
        self.pad_id = pad_id
        self.lengths = [len(d) for d in demos]
        self.dataset_normaliser = cfg.batch_size * sum(d.num_policy_tokens for d in demos) / len(demos)
        self._epoch_batches: dict[int, list[list[int]]] = {}

    def bind(self, model, accelerator) -> None:
        self.model = model
        self.accelerator = accelerator

    def _batches(self, epoch: int) -> list[list[int]]:
        if epoch not in self._epoch_batches:
            self._epoch_batches = {
                epoch: length_bucketed_batches(self.lengths, self.cfg.batch_size, self.cfg.train.seed, epoch)
            }
        return self._epoch_batches[epoch]

    def next_batch(self, step: int) -> dict[str, Any]:
        per_epoch = len(self._batches(0))
        indices = self._batches(step // per_epoch)[step % per_epoch]
        world = self.accelerator.num_processes
        local = indices[self.accelerator.process_index :: world]
        trajectories = [self.demos[i] for i in local]
        if self.cfg.normaliser == "dataset":
            normaliser = self.dataset_normaliser
        else:
            normaliser = sum(self.demos[i].num_policy_tokens for i in indices)
        return {"trajectories": trajectories, "normaliser": normaliser / world, "epoch": step / per_epoch}

    def micro_batches(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        trajs = sorted(batch["trajectories"], key=len)
        size = self.cfg.micro_batch_size
        return [
            {"trajectories": trajs[i : i + size], "normaliser": batch["normaliser"], "epoch": batch["epoch"]}
            for i in range(0, len(trajs), size)
        ]

    def loss(self, model, micro: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        tensors = collate(micro["trajectories"], self.pad_id).to(self.accelerator.device)
        logps, _ = model(tensors.input_ids, tensors.attention_mask, tensors.loss_mask)  # (B, T)
        loss = sft_loss(logps, tensors.loss_mask, micro["normaliser"])
        tokens = float(tensors.loss_mask.sum())
        padding = 1.0 - float(tensors.attention_mask.float().mean())
        return loss, {"sft/tokens": tokens, "sft/padding_fraction": padding, "sft/epoch": micro["epoch"]}


def train_sft(cfg: SFTConfig, demos: list[Trajectory] | None = None) -> dict[str, Any]:
    """Run SFT; returns {"final": path, "history": rows, "num_demos": n}."""
    accelerator = make_accelerator(cfg.train.mixed_precision, cfg.train.seed)
    run_dir = start_run("sft", cfg, accelerator)  # stops here if the folder holds another run
    if run_dir.finished is not None:
        return run_dir.finished
    if demos is None:  # before the model loads: a bad demonstration file stops the run in seconds, not minutes
        demos = build_demos(
            cfg.sources,
            load_stage_tokenizer(cfg.model.name),
            cfg.train.seed,
            log=accelerator.print,
            enable_thinking=cfg.enable_thinking,
        )
    policy, tokenizer, base_name = load_policy(cfg.model, accelerator.device, log=accelerator.print)
    context = context_length(policy)
    for demo in demos:  # the model's context is known only now
        check_length(demo, context, demo.task_id, f"the model's context, max_position_embeddings={context}")
    if len(demos) < cfg.batch_size:
        raise ValueError(
            f"{len(demos)} demonstrations cannot fill batch_size={cfg.batch_size}; add demonstrations or lower it"
        )
    objective = SFTObjective(demos, cfg, tokenizer.pad_token_id)
    policy.train()
    scorer = TokenScorer(policy)
    history = run_training(objective, scorer, cfg.train, cfg.optim, accelerator, run_dir, description="sft")
    whole = full_policy_state_dict(objective.model, accelerator)  # FSDP / ZeRO-3: gathered from the shards
    final = save_final(
        unwrap_policy(objective.model, accelerator),
        tokenizer,
        Path(cfg.train.output_dir),
        base_name,
        accelerator,
        state_dict=whole,
    )
    result = {"final": str(final), "history": history, "num_demos": len(demos)}
    run_dir.finish(cfg.train.steps, result)
    run_dir.close()
    return result
