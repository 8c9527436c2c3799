"""Bradley-Terry reward model on the same trajectories, from the same base model.

    agentic-rl rm [--config F] [--set pairs.tasks=128]      (every key: agentic-rl config rm)

The model is `AutoModelForSequenceClassification(num_labels=1)` built from the policy's base
(LoRA or full; with LoRA the score head is trained in full). The score r(x, y) is the head
applied to the hidden state of the trajectory's last real token (we pool by the attention
mask, not by searching for pad ids: SmolLM2's pad id is its end-of-turn id, which every
trajectory contains). Loss: −E[log σ(r(x, y_w) − r(x, y_l))] (algorithms/reward_model.py).

Pairs (chosen = graded correct, rejected = graded incorrect, same task):
  * sampled:   the SFT model's own attempts, G per task, graded by the environment; every
               (correct, incorrect) combination of a task up to `max_pairs_per_task`. Preferred:
               they look like what RL will score.
  * corrupted: an oracle demonstration vs. the same demonstration with a wrong final answer,
               or with a wrong tool result carried into a wrong final answer.
Held-out pairs come from the test split and give `rm/heldout_accuracy`.
"""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path
from typing import Any, Literal

import torch

from agentic_rl.algorithms.reward_model import bradley_terry_loss
from agentic_rl.config import Config, NonNegativeInt, PositiveFloat, PositiveInt, refuse_unused
from agentic_rl.envs.base import EnvSpec
from agentic_rl.models.chat_format import ChatFormat
from agentic_rl.models.device import load_for_decoding
from agentic_rl.models.policy import ModelConfig
from agentic_rl.models.reward_scorer import RewardScorer, load_reward_model, save_reward_model
from agentic_rl.models.stage_output import FINAL_DIR, load_stage_tokenizer
from agentic_rl.plugins import PluginsConfig
from agentic_rl.rollout.config import RolloutConfig
from agentic_rl.rollout.demos import oracle_demos, trajectory_from_messages
from agentic_rl.rollout.factory import build_engine
from agentic_rl.rollout.trajectory import Trajectory, collate
from agentic_rl.training.common import make_accelerator
from agentic_rl.training.loop import BatchObjective, LoopConfig, OptimConfig, run_training
from agentic_rl.training.run_dir import start_run
from agentic_rl.training.scoring import require_replicated_weights

_FINAL = re.compile(r"(Final Answer:\s*)(-?[\d,]*\.?\d+)")


@dataclasses.dataclass
class PairsConfig(Config):
    """Where chosen/rejected pairs come from."""

    source: Literal["sampled", "corrupted"] = "corrupted"
    """sampled: the policy's own attempts graded by the env; corrupted: broken oracle demonstrations."""
    env: EnvSpec = dataclasses.field(default_factory=EnvSpec)
    """Environment that provides tasks and grading, with its options."""
    policy: str = ""
    """For source=sampled: the model that samples attempts (e.g. the SFT stage's final/ folder)."""
    tasks: int = 64
    """Training tasks (train split)."""
    heldout_tasks: int = 32
    """Held-out tasks (test split) for pairwise accuracy."""
    samples_per_task: int = 4
    """For source=sampled: attempts per task."""
    max_pairs_per_task: int = 4
    """Most pairs taken from one task."""
    max_concurrent: PositiveInt = 64
    """For source=sampled: episodes decoded at once (the engine's slots; the rest wait for a free
    one). Memory grows with it: each slot holds a KV cache of rollout.max_episode_tokens. The
    episodes do not depend on it (each has its own random stream). The same name as eval's."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """For source=sampled: how attempts are decoded (limits, temperature, backend, device); for
    both sources, enable_thinking renders the pairs."""

    def __post_init__(self) -> None:
        if self.source != "sampled":  # corrupted pairs: one per oracle demonstration, nothing decoded
            why = dict(used_with="pairs.source: sampled", now=f"pairs.source is {self.source!r}")
            refuse_unused(
                self, ["policy", "samples_per_task", "max_pairs_per_task", "max_concurrent"], prefix="pairs.", **why
            )
            decoding = [f.name for f in dataclasses.fields(self.rollout) if f.name != "enable_thinking"]
            refuse_unused(self.rollout, decoding, prefix="pairs.rollout.", **why)


@dataclasses.dataclass
class RMLoopConfig(LoopConfig):
    """`agentic-rl rm`'s loop: LoopConfig with this command's own defaults."""

    steps: NonNegativeInt = 30
    output_dir: str = "runs/rm"


@dataclasses.dataclass
class RMOptimConfig(OptimConfig):
    """`agentic-rl rm`'s optimizer: OptimConfig with this command's own learning rate."""

    lr: PositiveFloat = 1e-4


@dataclasses.dataclass
class RMConfig(PluginsConfig):
    """`agentic-rl rm`: a Bradley-Terry reward model."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The base model (the same base as the policy) and adapters."""
    pairs: PairsConfig = dataclasses.field(default_factory=PairsConfig)
    """Pair source."""
    batch_size: PositiveInt = 8
    """Pairs per optimizer step (over all processes)."""
    optim: RMOptimConfig = dataclasses.field(default_factory=RMOptimConfig)
    """Optimizer."""
    train: RMLoopConfig = dataclasses.field(default_factory=RMLoopConfig)
    """Loop, output and checkpoints."""


def corrupt_messages(messages: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]] | None:
    """A wrong version of a correct demonstration: wrong final answer, or wrong tool result.

    Returns None when the demonstration has no final answer to corrupt.
    """
    final = messages[-1].get("content", "")
    match = _FINAL.search(final)
    if match is None:
        return None
    value = float(match.group(2).replace(",", ""))
    wrong = value + rng.choice([-1, 1]) * rng.randint(1, max(2, int(abs(value) * 0.5) + 1))
    wrong_text = str(int(wrong)) if wrong == int(wrong) else f"{wrong:.2f}"
    corrupted = [dict(m) for m in messages]
    corrupted[-1]["content"] = final[: match.start(2)] + wrong_text + final[match.end(2) :]
    tool_indices = [i for i, m in enumerate(corrupted) if m.get("role") == "tool"]
    if tool_indices and rng.random() < 0.5:
        last_tool = tool_indices[-1]
        corrupted[last_tool]["content"] = wrong_text  # the tool "said" the wrong value, carried to the end
    return corrupted


def build_pairs(
    cfg: PairsConfig, split: str, n_tasks: int, tokenizer: Any, seed: int
) -> list[tuple[Trajectory, Trajectory]]:
    """(chosen, rejected) trajectory pairs from `n_tasks` tasks of `split` (see module docstring)."""
    env = cfg.env.make()
    tasks = env.tasks(split, n=n_tasks, seed=seed)
    chat_format = ChatFormat.for_tokenizer(tokenizer, cfg.rollout.enable_thinking)
    if cfg.source == "sampled":
        return _sampled_pairs(cfg, tasks, seed)
    rng = random.Random(seed)
    pairs = []
    for demo in oracle_demos(env, tasks, chat_format):
        if demo.previous:  # the reward term scores an episode's last token sequence, not a re-render of it all
            raise ValueError(
                f"pairs.source=corrupted: env '{env.name}' drops turns from what the policy sees (task {demo.task_id} has "
                f"{len(demo.previous) + 1} token sequences), so a corrupted copy of the whole conversation would not look "
                "like anything the policy sees, and the RM would learn that difference; use pairs.source=sampled"
            )
        wrong = corrupt_messages(demo.messages, rng)
        if wrong is None:
            continue
        rejected = trajectory_from_messages(
            chat_format, wrong, env.tool_schemas, env.name, demo.task_id, {"correct": False}
        )
        pairs.append((demo, rejected))
    return pairs


def _sampled_pairs(cfg: PairsConfig, tasks: list, seed: int) -> list[tuple[Trajectory, Trajectory]]:
    if not cfg.policy:
        raise ValueError("pairs.policy is required for pairs.source=sampled (e.g. runs/demo/sft/final)")
    policy, tokenizer, _ = load_for_decoding(cfg.policy, cfg.rollout.device, key="pairs.rollout.device")
    engine = build_engine(
        policy,
        tokenizer,
        cfg.rollout,
        seed=seed,
        max_concurrent=min(cfg.max_concurrent, len(tasks) * cfg.samples_per_task),
    )
    envs = [cfg.env.make() for _ in range(len(tasks) * cfg.samples_per_task)]
    episodes = engine.run(envs, [t for t in tasks for _ in range(cfg.samples_per_task)])
    pairs = []
    for index in range(len(tasks)):
        group = episodes[index * cfg.samples_per_task : (index + 1) * cfg.samples_per_task]
        good = [t for t in group if t.info.get("correct")]
        bad = [t for t in group if not t.info.get("correct")]
        pairs.extend([(g, b) for g in good for b in bad][: cfg.max_pairs_per_task])
    return pairs


def pair_scores(
    scorer, pairs: list[tuple[Trajectory, Trajectory]], pad_id: int, device: Any = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen scores (N,), rejected scores (N,)) of N pairs, both sides in one forward."""
    sides = [p[0] for p in pairs] + [p[1] for p in pairs]
    tensors = collate(sides, pad_id).to(device)
    scores = scorer(tensors.input_ids, tensors.attention_mask)  # (2N,)
    return scores[: len(pairs)], scores[len(pairs) :]


class RMObjective(BatchObjective):
    """Bradley-Terry loss over pair batches; chosen and rejected are scored in one forward."""

    def __init__(self, pairs, heldout, cfg: RMConfig, pad_id: int):
        self.pairs, self.heldout, self.cfg, self.pad_id = pairs, heldout, cfg, pad_id

    def bind(self, model, accelerator) -> None:
        self.model, self.accelerator = model, accelerator

    def next_batch(self, step: int) -> list:
        per_epoch = max(1, len(self.pairs) // self.cfg.batch_size)
        order = list(range(len(self.pairs)))
        random.Random(self.cfg.train.seed * 1_000_003 + step // per_epoch).shuffle(order)
        start = (step % per_epoch) * self.cfg.batch_size
        chosen = [self.pairs[i] for i in order[start : start + self.cfg.batch_size]]
        return chosen[self.accelerator.process_index :: self.accelerator.num_processes]

    def micro_batches(self, batch: list) -> list:
        return [batch]

    def scores(self, model, pairs) -> tuple[torch.Tensor, torch.Tensor]:
        return pair_scores(model, pairs, self.pad_id, self.accelerator.device)

    def loss(self, model, batch) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = self.scores(model, batch)
        loss, accuracy = bradley_terry_loss(chosen, rejected)
        return loss, {"rm/train_accuracy": float(accuracy), "rm/margin": float((chosen - rejected).detach().mean())}

    @torch.no_grad()
    def heldout_accuracy(self) -> float:
        correct = 0
        for start in range(0, len(self.heldout), 8):
            chosen, rejected = self.scores(self.model, self.heldout[start : start + 8])
            correct += int((chosen > rejected).sum())
        return correct / max(1, len(self.heldout))


# Why a pair source gives fewer pairs than tasks, as the error for too few says it.
_FEW_PAIRS_WHY = {
    "corrupted": "corrupted pairs: one per oracle demonstration that ends in a numeric `Final Answer:`; "
    "an env whose answers are not numbers gives none, and needs pairs.source=sampled",
    "sampled": "sampled pairs: one per task where the policy's samples are sometimes right and sometimes "
    "wrong; a policy that always or never solves them gives none",
}


def train_rm(cfg: RMConfig) -> dict[str, Any]:
    """Train the reward model; returns {"final", "heldout_accuracy", "heldout_accuracy_before", "pairs"}."""
    accelerator = make_accelerator(cfg.train.mixed_precision, cfg.train.seed)
    require_replicated_weights(accelerator, "rm")  # rollouts / the reward head read whole weights
    run_dir = start_run("rm", cfg, accelerator)  # stops here if the folder holds another run
    if run_dir.finished is not None:
        return run_dir.finished
    # The pairs first, with the tokenizer the classifier will have: too few stops before the model loads.
    tokenizer = load_stage_tokenizer(cfg.model.name)
    pairs = build_pairs(cfg.pairs, "train", cfg.pairs.tasks, tokenizer, cfg.train.seed)
    heldout = build_pairs(cfg.pairs, "test", cfg.pairs.heldout_tasks, tokenizer, cfg.train.seed + 1)
    if len(pairs) < cfg.batch_size or not heldout:
        raise ValueError(
            f"only {len(pairs)} training and {len(heldout)} held-out pairs (batch_size {cfg.batch_size}); "
            f"raise pairs.tasks / pairs.heldout_tasks ({_FEW_PAIRS_WHY[cfg.pairs.source]})"
        )
    classifier, tokenizer, base = load_reward_model(cfg.model, accelerator.device, log=accelerator.print)
    objective = RMObjective(pairs, heldout, cfg, tokenizer.pad_token_id)
    scorer = RewardScorer(classifier)
    objective.bind(scorer, accelerator)
    before = objective.heldout_accuracy()
    classifier.train()
    run_training(objective, scorer, cfg.train, cfg.optim, accelerator, run_dir, description="rm")
    classifier.eval()
    after = objective.heldout_accuracy()
    run_dir.log(cfg.train.steps, {"rm/heldout_accuracy": after, "rm/heldout_accuracy_before": before})
    target = Path(cfg.train.output_dir) / FINAL_DIR
    if accelerator.is_main_process:
        save_reward_model(accelerator.unwrap_model(objective.model).classifier, tokenizer, target, base)
    result = {
        "final": str(target),
        "heldout_accuracy": after,
        "heldout_accuracy_before": before,
        "pairs": len(pairs),
        "heldout_pairs": len(heldout),
    }
    run_dir.finish(cfg.train.steps, result)
    run_dir.close()
    return result
