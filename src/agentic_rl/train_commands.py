"""The commands that train: which config class each reads and which function runs it.

    agentic-rl sft|rm|grpo|ppo|pipeline --config FILE [--set key=value ...]      (cli.py parses them)

Each function imports its trainer when it runs, so `agentic-rl --help` stays fast. The CLI picks
GRPO's backend here (ours or TRL's, integrations/backends.py); training/ never calls up.
"""

from __future__ import annotations


def _train_sft(cfg):
    from agentic_rl.training.sft import train_sft

    return train_sft(cfg)


def _train_rm(cfg):
    from agentic_rl.training.reward_model import train_rm

    return train_rm(cfg)


def _train_grpo(cfg):
    from agentic_rl.integrations.backends import train_grpo_with_backend  # ours, or TRL's for backend: trl

    return train_grpo_with_backend(cfg)


def _train_ppo(cfg):
    from agentic_rl.training.ppo import train_ppo

    return train_ppo(cfg)


def _run_pipeline(cfg):
    from agentic_rl.pipeline import run_pipeline

    return run_pipeline(cfg)


TRAIN_COMMANDS = {
    "sft": ("agentic_rl.training.sft", "SFTConfig", _train_sft, "supervised fine-tuning (LoRA or full) on demonstrations"),
    "rm": ("agentic_rl.training.reward_model", "RMConfig", _train_rm, "train a Bradley-Terry reward model"),
    "grpo": ("agentic_rl.training.grpo_config", "GRPOConfig", _train_grpo, "GRPO on multi-turn agent episodes (backend: agentic_rl or trl)"),
    "ppo": ("agentic_rl.training.ppo_config", "PPOConfig", _train_ppo, "PPO with a value model and GAE on multi-turn agent episodes"),
    "pipeline": ("agentic_rl.pipeline", "PipelineConfig", _run_pipeline, "evaluate -> SFT -> RM -> GRPO -> evaluate, with a report"),
}
"""command -> (config module, config class, the function that runs it, help)."""
