from agentic_rl.rewards.base import RewardComposer, RewardSpec, get_reward, list_rewards, register_reward

__all__ = ["RewardComposer", "RewardSpec", "get_reward", "list_rewards", "register_reward"]
