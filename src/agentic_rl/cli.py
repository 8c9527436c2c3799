"""The `agentic-rl` command line.

    agentic-rl envs list
    agentic-rl envs oracle arith --n 50 --split test
    agentic-rl tools run calculator --expression "48/2"
    agentic-rl tools run python --code "print(2**10)"
    agentic-rl rewards list
    agentic-rl eval --model smollm2-135m-instruct --env arith --n 48
    agentic-rl sft      --config configs/sft.yaml  [--set key=value ...]
    agentic-rl rm       --config configs/rm.yaml   [--set key=value ...]
    agentic-rl grpo     --config configs/grpo.yaml [--set key=value ...]
    agentic-rl merge    --adapters runs/sft/final --out merged/
    agentic-rl pipeline --config configs/demo.yaml
    agentic-rl config   sft|rm|grpo|pipeline       (every key, its type, default and meaning)

Heavy imports (torch, transformers) happen inside the commands, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable


def _print_json(payload: Any) -> None:
    print(json.dumps(payload, indent=None, default=str))


def _cmd_envs_list(args: argparse.Namespace) -> int:
    from agentic_rl.envs.base import env_options_class, list_envs
    from agentic_rl.config import describe

    for name in list_envs():
        options = env_options_class(name)
        print(name)
        if args.verbose and options is not None:
            for line in describe(options):
                print(f"    {line}")
    return 0


def _cmd_envs_oracle(args: argparse.Namespace) -> int:
    from agentic_rl.envs.oracle import run_oracle

    options = _parse_options(args.option)
    summary = run_oracle(args.env, n=args.n, split=args.split, seed=args.seed, **options)
    _print_json(summary)
    return 0 if summary.get("accuracy", 0.0) == 1.0 else 1


def _cmd_tools_run(args: argparse.Namespace) -> int:
    from agentic_rl.tools.base import ToolError, get_tool

    tool = get_tool(args.tool)
    arguments = _parse_options(args.arg)
    if args.expression is not None:
        arguments["expression"] = args.expression
    if args.code is not None:
        arguments["code"] = args.code
    try:
        result = {"tool": tool.name, "ok": True, "result": tool.call(arguments)}
    except ToolError as exc:
        result = {"tool": tool.name, "ok": False, "error": str(exc)}
    _print_json(result)
    return 0 if result["ok"] else 1


def _cmd_rewards_list(args: argparse.Namespace) -> int:
    from agentic_rl.rewards.base import get_reward, list_rewards, reward_parameters

    for name in list_rewards():
        fn = get_reward(name)
        doc = (getattr(fn, "__wrapped__", fn).__doc__ or "").strip().splitlines()[0]
        print(f"{name:16s} params={reward_parameters(name)}  {doc}")
    return 0


def _parse_options(pairs: list[str] | None) -> dict[str, Any]:
    import yaml

    options: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"error: option '{pair}' must look like key=value")
        key, raw = pair.split("=", 1)
        options[key] = yaml.safe_load(raw)
    return options


_LATER_COMMANDS: dict[str, tuple[str, str]] = {}


def _config_command(name: str, module: str, help_text: str) -> None:
    _LATER_COMMANDS[name] = (module, help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentic-rl", description="Train small LLM agents with tools: SFT -> reward model -> GRPO.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    envs = sub.add_parser("envs", help="list environments or run the scripted oracle policy").add_subparsers(dest="envs_command", required=True)
    p = envs.add_parser("list", help="list registered environments")
    p.add_argument("-v", "--verbose", action="store_true", help="also list each environment's options")
    p.set_defaults(func=_cmd_envs_list)
    p = envs.add_parser("oracle", help="run the oracle policy through the environment API; last line is a JSON summary")
    p.add_argument("env", help="environment name (see `agentic-rl envs list`)")
    p.add_argument("--n", type=int, default=50, help="number of tasks")
    p.add_argument("--split", default="test", choices=["train", "test"], help="task split")
    p.add_argument("--seed", type=int, default=0, help="task seed")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="environment option, repeatable (e.g. difficulty=3)")
    p.set_defaults(func=_cmd_envs_oracle)

    tools = sub.add_parser("tools", help="run a tool by hand").add_subparsers(dest="tools_command", required=True)
    p = tools.add_parser("run", help="run one tool call and print the result as JSON")
    p.add_argument("tool", help="tool name: calculator or python")
    p.add_argument("--expression", help="calculator: the expression")
    p.add_argument("--code", help="python: the code to run in the sandbox")
    p.add_argument("--arg", action="append", metavar="KEY=VALUE", help="any other tool argument, repeatable")
    p.set_defaults(func=_cmd_tools_run)

    rewards = sub.add_parser("rewards", help="list reward terms").add_subparsers(dest="rewards_command", required=True)
    p = rewards.add_parser("list", help="list registered reward terms and their parameters")
    p.set_defaults(func=_cmd_rewards_list)

    for name, (module, help_text) in _LATER_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        __import__(module, fromlist=["add_arguments"]).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    from agentic_rl.config import ConfigError

    try:
        return func(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
