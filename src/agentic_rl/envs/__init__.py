"""Environments: the Env API, the registry and the built-in tasks (arith, gsm8k, self_correct)."""

from agentic_rl.envs.base import Env, StepResult, Task, list_envs, make_env, register_env

__all__ = ["Env", "StepResult", "Task", "list_envs", "make_env", "register_env"]
