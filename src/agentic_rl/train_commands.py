"""The commands that read a config: which config class each reads, and for the commands that
train, which function runs it.

    agentic-rl sft|rm|grpo|ppo|pipeline --config FILE [--set key=value ...]      (cli.py parses them)
    agentic-rl config eval|audit|chat|serve|sft|rm|grpo|ppo|pipeline             (config_class)

Each function imports its trainer or class when it is called, by a plain import statement (most
config classes live beside their torch code), so `agentic-rl --help` stays fast. The CLI picks
GRPO's backend here (ours or TRL's, integrations/backends.py); training/ never calls up.
"""

from __future__ import annotations


def _train_sft(cfg):
    from agentic_rl.training.sft import train_sft  # local: torch-free

    return train_sft(cfg)


def _train_rm(cfg):
    from agentic_rl.training.reward_model import train_rm  # local: torch-free

    return train_rm(cfg)


def _train_grpo(cfg):
    # ours, or TRL's for backend: trl
    from agentic_rl.integrations.backends import train_grpo_with_backend  # local: torch-free

    return train_grpo_with_backend(cfg)


def _train_ppo(cfg):
    from agentic_rl.training.ppo import train_ppo  # local: torch-free

    return train_ppo(cfg)


def _run_pipeline(cfg):
    from agentic_rl.pipeline import run_pipeline  # local: torch-free

    return run_pipeline(cfg)


TRAIN_COMMANDS = {
    "sft": (_train_sft, "supervised fine-tuning (LoRA or full) on demonstrations"),
    "rm": (_train_rm, "train a Bradley-Terry reward model"),
    "grpo": (_train_grpo, "GRPO on multi-turn agent episodes (backend: agentic_rl or trl)"),
    "ppo": (_train_ppo, "PPO with a value model and GAE on multi-turn agent episodes"),
    "pipeline": (_run_pipeline, "evaluate -> SFT -> RM -> GRPO -> evaluate, with a report"),
}
"""command -> (the function that runs it, help)."""

CONFIGURED_COMMANDS = ("eval", "audit", "chat", "serve", *TRAIN_COMMANDS)
"""Every command that reads a config class (`agentic-rl config <command>` lists its keys)."""


def next_step(command: str, cfg, summary: dict) -> str:
    """Where a finished training command left its results, and the command a user runs next."""
    if command == "pipeline":
        return f"done: the report is {summary['report']} (each stage's folder beside it holds its run)"
    final = summary.get("final", "")
    where = f"done: {cfg.train.output_dir} holds the run (metrics.jsonl, tb/ for TensorBoard, final/ the model)"
    if command == "sft":
        envs = [source.env.name for source in cfg.sources if source.kind == "oracle"]
        return f"{where}\nnext: agentic-rl grpo --set model.name={final} --set env.name={envs[0] if envs else '<env>'}   (RL from it)"
    if command == "rm":
        return f"{where}\nnext: agentic-rl grpo --set reward_model.path={final} --set reward_model.weight=0.5   (train with it)"
    return f"{where}\nnext: agentic-rl eval --model {final} --env {cfg.env.name}   (held-out accuracy)"


def config_class(command: str) -> type:
    """The config class `command` (one of CONFIGURED_COMMANDS) reads."""
    match command:
        case "eval":
            from agentic_rl.evaluation.config import EvalCommandConfig as cls  # local: torch-free
        case "audit":
            from agentic_rl.evaluation.config import AuditConfig as cls  # local: torch-free
        case "chat":
            from agentic_rl.serving.chat import ChatConfig as cls  # local: torch-free
        case "serve":
            from agentic_rl.serving.config import ServeConfig as cls  # local: torch-free
        case "sft":
            from agentic_rl.training.sft import SFTConfig as cls  # local: torch-free
        case "rm":
            from agentic_rl.training.reward_model import RMConfig as cls  # local: torch-free
        case "grpo":
            from agentic_rl.training.grpo_config import GRPOConfig as cls  # local: torch-free
        case "ppo":
            from agentic_rl.training.ppo_config import PPOConfig as cls  # local: torch-free
        case "pipeline":
            from agentic_rl.pipeline import PipelineConfig as cls  # local: torch-free
        case _:
            raise KeyError(f"{command!r} reads no config; commands that do: {', '.join(CONFIGURED_COMMANDS)}")
    return cls
