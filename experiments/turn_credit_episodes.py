"""The credit each GRPO advantage mode gives the turns of real episodes: sampled groups, three columns.

    python experiments/turn_credit_episodes.py --config configs/experiments/plan-fast-grpo.yaml \
        --model runs/plan-fast/sft/final --houses 2 --seed 0 --out credit.json

Rolls out `--houses` training tasks of the config's env, `rollout.group_size` episodes each, with
the model at the config's sampling temperature, scores them with the config's reward terms, and
computes, per turn, the advantage each mode would train on:

  * episode: the episode's group-normalised reward, the same on every turn (`group_advantages`);
  * turn: the turn's return-to-go against the group's mean episode return (baseline "start");
  * turn_position: the turn's return-to-go against the group's mean return-to-go at that turn.

These are the functions GRPO's step calls (training/grpo.py `advantages`), on the same rewards
placed on turns (`rewards_per_turn`), so the table is what a step would have used. Printed: one
Markdown table per group (episode, turn, its actions, the turn's reward, the three advantages);
`--out` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from agentic_rl.algorithms.grpo import group_advantages
from agentic_rl.algorithms.turn_credit import discounted_turn_returns, turn_advantages
from agentic_rl.config import load_config
from agentic_rl.models.device import load_for_decoding
from agentic_rl.rewards.base import RewardComposer
from agentic_rl.rollout.factory import build_engine
from agentic_rl.tools.parse import parse_tool_calls
from agentic_rl.train_commands import config_class
from agentic_rl.training.episodes import rewards_per_turn


def turn_actions(messages: list[dict], turns: int) -> list[str]:
    """Each assistant turn's tool calls as `name(argument)`, or its first 40 characters if it called none."""
    out = []
    for message in [m for m in messages if m["role"] == "assistant"][:turns]:
        calls = [call for call in parse_tool_calls(str(message.get("content", ""))) if call.ok]
        if calls:
            out.append(
                " ".join(f"{call.name}({','.join(str(v) for v in (call.arguments or {}).values())})" for call in calls)
            )
        else:
            out.append(repr(str(message.get("content", ""))[:40]))
    return out + ["?"] * (turns - len(out))


def credit_table(trajs, rewards: list[float], cfg) -> list[dict]:
    """One row per (episode, turn): the turn's placed reward and the three modes' advantages."""
    G, scale = cfg.rollout.group_size, cfg.loss.scale_rewards
    placed = rewards_per_turn(trajs, rewards, cfg.rewards)
    returns = discounted_turn_returns(placed, cfg.advantage.gamma_per_turn)
    episode = group_advantages(torch.tensor(rewards, dtype=torch.float32), G, scale).tolist()
    start = turn_advantages(returns, G, scale, baseline="start")
    position = turn_advantages(returns, G, scale, baseline="position")
    rows = []
    for i, traj in enumerate(trajs):
        actions = turn_actions(traj.messages, len(placed[i]))
        for t in range(len(placed[i])):
            rows.append(
                {
                    "group": i // G,
                    "episode": i % G,
                    "task": traj.task_id,
                    "correct": bool(traj.info.get("correct")),
                    "reward": rewards[i],
                    "turn": t,
                    "actions": actions[t],
                    "turn_reward": placed[i][t],
                    "return_to_go": returns[i][t],
                    "episode_mode": episode[i],
                    "turn_mode": start[i][t],
                    "turn_position_mode": position[i][t],
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a GRPO config (its env, rollout, rewards, loss.scale_rewards)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--houses", type=int, default=2, help="training tasks, one group each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the rows as JSON here")
    args = parser.parse_args()
    cfg = load_config(config_class("grpo"), args.config, overrides=[f"model.name={args.model}"])
    env = cfg.env.make()
    pool = env.tasks("train", n=cfg.env.task_pool, seed=cfg.train.seed)  # the pool GRPO draws from
    tasks = random.Random(args.seed).sample(pool, args.houses)
    model, tokenizer, _ = load_for_decoding(args.model, cfg.rollout.device)
    G = cfg.rollout.group_size
    engine = build_engine(model, tokenizer, cfg.rollout, seed=args.seed, max_concurrent=G * args.houses)
    trajs = engine.run(
        [cfg.env.make() for _ in range(G * args.houses)], [t for t in tasks for _ in range(G)], seed=args.seed
    )
    rewards = RewardComposer(cfg.rewards)(trajs)
    rows = credit_table(trajs, rewards, cfg)
    print("| group | ep | solved | reward | turn | actions | turn reward | episode | turn | turn_position |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['group']} | {row['episode']} | {'yes' if row['correct'] else 'no'} | {row['reward']:+.3f} | {row['turn']} | "
            f"{row['actions']} | {row['turn_reward']:+.3f} | {row['episode_mode']:+.2f} | {row['turn_mode']:+.2f} | "
            f"{row['turn_position_mode']:+.2f} |"
        )
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"config": args.config, "model": args.model, "seed": args.seed, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
