"""The `agentic-rl` command line.

    agentic-rl envs list
    agentic-rl envs oracle arith --n 50 --split test
    agentic-rl tools list -v
    agentic-rl tools run calculator --expression "48/2"
    agentic-rl tools run python --code "print(2**10)"
    agentic-rl rewards list
    agentic-rl eval --model smollm2-135m-instruct --env arith --n 48 [--k 8 --out sft.json] [--config F --set key=value]
    agentic-rl compare sft.json grpo.json [more.json]  (paired difference, 95% CI, McNemar; several B: also their mean, and runs as units)
    agentic-rl compare --a g0.json g1.json --b p0.json p1.json  (several A: A is their per-problem mean)
    agentic-rl audit --model M --env arith [--n 8]     (template prefixes, masks, log-probs, weight sync)
    agentic-rl chat  --model M [--env arith]           (a terminal conversation; tool calls shown as they run)
    agentic-rl serve --model M [--env arith] [--host H --port P]   (OpenAI-compatible HTTP server)
    agentic-rl sft      [--config F] [--set key=value ...]   (keys: agentic-rl config sft)
    agentic-rl rm       [--config F] [--set key=value ...]   (keys: agentic-rl config rm)
    agentic-rl grpo     [--config F] [--set key=value ...]   (keys: agentic-rl config grpo; backend: agentic_rl | trl)
    agentic-rl ppo      [--config F] [--set key=value ...]   (keys: agentic-rl config ppo; value model: shared | separate)
    agentic-rl merge    --adapters runs/sft/final --out merged/
    agentic-rl pipeline --config configs/demo.yaml
    agentic-rl config   eval|sft|rm|grpo|ppo|pipeline  (every key, its type, default and meaning)
    agentic-rl metrics                             (every metric key in metrics.jsonl, defined)

Every command that builds envs, tools or rewards takes `--plugin MODULE_OR_FILE` (repeatable): your
own registrations, imported before the config is read (agentic_rl.plugins).

Heavy imports (torch, transformers) happen inside the commands (`# local: torch-free`), so `--help`
loads no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from agentic_rl.cli_flags import add_flagged, add_plugin_flag, load_flagged, load_plugin_flags, parse_options
from agentic_rl.config import ConfigError
from agentic_rl.config_docs import describe, markdown_reference
from agentic_rl.errors import RunStopped, capped
from agentic_rl.evaluation.report import REPORT_NAME, failure_headline
from agentic_rl.strict_json import dumps, require_file_path, write_json
from agentic_rl.train_commands import CONFIGURED_COMMANDS, TRAIN_COMMANDS, config_class, next_step
from agentic_rl.training.metric_keys import GLOSSARY, glossary_markdown


def _print_json(payload: Any) -> None:
    print(dumps(payload, indent=None))


def _cmd_envs_list(args: argparse.Namespace) -> int:
    load_plugin_flags(args)
    from agentic_rl.envs.base import env_factory, env_options_class, list_envs  # local: torch-free

    for name in list_envs():
        options = env_options_class(name)
        catalogue = getattr(env_factory(name), "catalogue", None)  # a bridge: what its installed library offers
        print(f"{name}: {catalogue()}" if catalogue else name)
        if args.verbose and options is not None:
            for line in describe(options):
                print(f"    {line}")
    return 0


def _cmd_envs_oracle(args: argparse.Namespace) -> int:
    load_plugin_flags(args)
    from agentic_rl.envs.oracle import run_oracle  # local: torch-free

    options = parse_options(args.option)
    summary = run_oracle(args.env, n=args.n, split=args.split, seed=args.seed, **options)
    _print_json(summary)
    return 0 if summary.get("accuracy", 0.0) == 1.0 else 1


def _cmd_tools_run(args: argparse.Namespace) -> int:
    load_plugin_flags(args)
    from agentic_rl.tools.base import ToolError, get_tool  # local: torch-free

    tool = get_tool(args.tool)
    arguments = parse_options(args.arg, flag="--arg")
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


def _cmd_tools_list(args: argparse.Namespace) -> int:
    load_plugin_flags(args)
    from agentic_rl.tools.base import ToolUnavailable, get_tool, list_tools  # local: torch-free

    for name in list_tools():
        print(name)
        if not args.verbose:
            continue
        try:
            function = get_tool(name).schema["function"]
        except ToolUnavailable as exc:  # e.g. python where the sandbox cannot run
            print(f"    unavailable here: {exc}")
            continue
        print(f"    {function.get('description', '').strip().splitlines()[0] if function.get('description') else ''}")
        required = set(function["parameters"].get("required", []))
        for param, spec in function["parameters"].get("properties", {}).items():
            kind = spec.get("type", "any") + ("" if param in required else ", optional")
            print(f"    {param} ({kind}): {spec.get('description', '')}")
    return 0


def _cmd_rewards_list(args: argparse.Namespace) -> int:
    load_plugin_flags(args)
    from agentic_rl.rewards.base import get_reward, list_rewards, reward_parameters  # local: torch-free

    for name in list_rewards():
        fn = get_reward(name)
        doc = (getattr(fn, "__wrapped__", fn).__doc__ or "").strip().splitlines()[0]
        print(f"{name:16s} params={reward_parameters(name)}  {doc}")
    return 0


_EVAL_FLAGS = {  # flag (argparse dest) -> the EvalCommandConfig key it overrides
    "model": "model",
    "env": "env.name",
    "n": "n",
    "k": "k",
    "temperature": "rollout.sampling.temperature",
    "split": "split",
    "seed": "seed",
    "max_concurrent": "max_concurrent",
    "max_turn_tokens": "rollout.max_turn_tokens",
    "max_turns": "rollout.max_turns",
    "dtype": "rollout.dtype",
    "backend": "rollout.backend",
    "device": "rollout.device",
    "label": "label",
    "out": "out",
}


def _cmd_eval(args: argparse.Namespace) -> int:
    from agentic_rl.evaluation.config import EvalCommandConfig  # local: torch-free
    from agentic_rl.evaluation.runner import evaluate  # local: torch-free
    from agentic_rl.models.device import load_for_decoding  # local: torch-free

    cfg = load_flagged(args, _EVAL_FLAGS, EvalCommandConfig)
    if cfg.out:
        _prepare_out(cfg.out)  # before the evaluation, not after minutes of it
    model, tokenizer, _ = load_for_decoding(cfg.model, cfg.rollout.device)
    result = evaluate(model, tokenizer, cfg, progress=not args.json)
    if cfg.out:
        write_json(cfg.out, {"model": cfg.model, "env": cfg.env.name, "label": cfg.label, **result})
    failures = result.pop("failures")
    per_task = result.pop("per_task")
    if not args.json:
        for key, value in result.items():
            print(f"{key:28s} {value:.4f}" if isinstance(value, float) else f"{key:28s} {value}")
        print(f"{'problems':28s} {len(per_task['id'])} (per-problem results: --out FILE, then `agentic-rl compare`)")
        for failure in failures:
            print(f"\n--- failure {failure_headline(failure)}")
            for message in failure["messages"]:
                if message["role"] != "system":
                    print(f"[{message['role']}] {message.get('content', '')}")
    _print_json({"model": cfg.model, "env": cfg.env.name, **result})
    return 0


def _at_least_one(text: str) -> int:
    """argparse type of a count: a whole number >= 1 (`envs oracle --n 0` reported accuracy 0.0 and
    exited 1, as if the oracle had failed)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} tasks: give at least 1")
    return value


def _prepare_out(out: str, folder: bool = False) -> None:
    """`--out`: its missing parent folders are created (eval's --out FILE; merge's --out FOLDER);
    a folder where a file goes, a file where a folder goes, or a path under a file is a ValueError
    naming it (eval raised a raw traceback after the whole evaluation; merge "succeeded", writing nothing)."""
    path = Path(out)
    if not folder and path.is_dir():
        raise ValueError(f"--out '{out}' is a folder; give a file name, e.g. --out {path / 'eval.json'}")
    if not folder:
        require_file_path(path)  # before the evaluation, not after it: a device node, FIFO or symlink is refused
    if folder and path.exists() and not path.is_dir():
        raise ValueError(f"--out '{out}' is a file; merge writes a model folder: give a folder path")
    try:
        (path if folder else path.parent).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"--out '{out}': a part of it is a file, not a folder; give another path") from None
    except OSError as exc:
        raise ValueError(
            f"--out '{out}': cannot create {path if folder else path.parent} ({exc.strerror}); "
            "give a path in a writable folder"
        ) from None


_CHAT_FLAGS = {
    "model": "model",
    "env": "env.name",
    "temperature": "rollout.sampling.temperature",
    "max_turns": "rollout.max_turns",
    "max_turn_tokens": "rollout.max_turn_tokens",
    "device": "rollout.device",
}


def _cmd_chat(args: argparse.Namespace) -> int:
    from agentic_rl.models.device import load_for_decoding  # local: torch-free
    from agentic_rl.serving.chat import ChatConfig, chat_loop  # local: torch-free

    cfg = load_flagged(args, _CHAT_FLAGS, ChatConfig)
    model, tokenizer, _ = load_for_decoding(cfg.model, cfg.rollout.device)
    tools = [tool.name for tool in cfg.env.make().tools]
    print(f"chatting with {cfg.model}, tools: {', '.join(tools)}; end with Ctrl-D or 'exit'")

    def read() -> str | None:
        try:
            return input("you> ")
        except EOFError:
            return None

    def show(event) -> None:
        kind, text = event
        print({"assistant": "agent> ", "call": "  -> ", "result": "  <- "}[kind] + text, flush=True)

    chat_loop(model, tokenizer, tools, cfg.rollout, read, show, seed=cfg.seed)
    return 0


_SERVE_FLAGS = {
    "model": "model",
    "env": "env.name",
    "host": "host",
    "port": "port",
    "served_name": "served_name",
    "temperature": "rollout.sampling.temperature",
    "max_turns": "rollout.max_turns",
    "max_turn_tokens": "rollout.max_turn_tokens",
    "max_concurrent": "max_concurrent",
    "dtype": "rollout.dtype",
    "backend": "rollout.backend",
    "device": "rollout.device",
    "seed": "seed",
}


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentic_rl.serving.config import ServeConfig  # local: torch-free
    from agentic_rl.serving.server import serve  # local: torch-free

    if args.option and args.env is None:
        raise ValueError("--option sets an environment option, which needs --env (agent mode)")
    serve(load_flagged(args, _SERVE_FLAGS, ServeConfig))
    return 0


_AUDIT_FLAGS = {
    "model": "model",
    "env": "env.name",
    "n": "n",
    "seed": "seed",
    "split": "split",
    "tolerance": "tolerance",
    "device": "rollout.device",
}


def _cmd_audit(args: argparse.Namespace) -> int:
    from agentic_rl.evaluation.audit import format_report, run_audit  # local: torch-free
    from agentic_rl.evaluation.config import AuditConfig  # local: torch-free
    from agentic_rl.models.device import load_for_decoding  # local: torch-free

    cfg = load_flagged(args, _AUDIT_FLAGS, AuditConfig)
    model, tokenizer, _ = load_for_decoding(cfg.model, cfg.rollout.device)
    results = run_audit(model, tokenizer, cfg)
    print(format_report(results))
    _print_json(
        {
            "model": cfg.model,
            "env": cfg.env.name,
            "passed": all(r.passed for r in results),
            "checks": {r.name: {"passed": r.passed, "summary": r.summary} for r in results},
        }
    )
    return 0 if all(r.passed for r in results) else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    from agentic_rl.evaluation.compare import compare_paths, format_rows  # local: torch-free

    if args.a or args.b:
        if args.inputs or not (args.a and args.b):
            raise ValueError("compare takes either positional inputs (A B [B ...]) or both --a and --b, not a mix")
        paths_a, paths_b = args.a, args.b
    elif len(args.inputs) < 2:
        raise ValueError(
            "compare needs A and at least one B: `agentic-rl compare A B [B ...]` or `--a A [A ...] --b B [B ...]`"
        )
    else:
        paths_a, paths_b = args.inputs[:1], args.inputs[1:]
    rows = compare_paths(paths_a, paths_b)
    if not args.json:
        mean_a = " (their per-problem mean)" if len(paths_a) > 1 else ""
        print(f"A = {', '.join(paths_a)}{mean_a}\nB = {', '.join(paths_b)}\n")
        print("\n".join(format_rows(rows)))
        print()
    _print_json(rows)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from agentic_rl.validation import load_and_validate  # local: torch-free

    train = TRAIN_COMMANDS[args.command][0]
    cfg = load_and_validate(config_class(args.command), args.config, args.set, plugins=args.plugin)
    result = train(cfg)
    summary = {k: v for k, v in result.items() if k != "history"} if isinstance(result, dict) else {}
    if args.command == "pipeline":  # each stage's outcome; its inputs are in config.yaml, its evals in summary.json
        summary = {stage: {k: v for k, v in r.items() if k not in ("evals", "inputs")} for stage, r in result.items()}
        summary["report"] = str(Path(cfg.output_dir) / REPORT_NAME)
    print(next_step(args.command, cfg, summary))
    _print_json(summary)
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    if args.which is None and not args.markdown:
        raise ValueError(
            "agentic-rl config: name a command (e.g. `agentic-rl config grpo`), or give --markdown for all"
        )
    commands = [args.which] if args.which else sorted(CONFIGURED_COMMANDS)
    described = {command: describe(config_class(command)) for command in commands}
    print(markdown_reference(described) if args.markdown else "\n".join(described[commands[0]]))
    return 0


def _cmd_metrics(args: argparse.Namespace) -> int:
    print(
        glossary_markdown() if args.markdown else "\n".join(f"{key:34s} {meaning}" for key, meaning in GLOSSARY.items())
    )
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from agentic_rl.models.stage_output import merge_adapters  # local: torch-free

    _prepare_out(args.out, folder=True)
    out = merge_adapters(args.adapters, args.out)
    _print_json({"merged": str(out)})
    return 0


def build_parser() -> argparse.ArgumentParser:
    from agentic_rl.evaluation.config import AuditConfig, EvalCommandConfig  # local: torch-free
    from agentic_rl.serving.chat import ChatConfig  # local: torch-free
    from agentic_rl.serving.config import ServeConfig  # local: torch-free

    parser = argparse.ArgumentParser(
        prog="agentic-rl", description="Train small LLM agents with tools: SFT -> reward model -> GRPO."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    envs = sub.add_parser("envs", help="list environments or run the scripted oracle policy").add_subparsers(
        dest="envs_command", required=True
    )
    p = envs.add_parser("list", help="list registered environments")
    p.add_argument("-v", "--verbose", action="store_true", help="also list each environment's options")
    add_plugin_flag(p)
    p.set_defaults(func=_cmd_envs_list)
    p = envs.add_parser("oracle", help="run the oracle policy through the environment API; last line is a JSON summary")
    p.add_argument("env", help="environment name (see `agentic-rl envs list`)")
    p.add_argument("--n", type=_at_least_one, default=50, help="number of tasks (at least 1)")
    p.add_argument("--split", default="test", choices=["train", "test"], help="task split")
    p.add_argument("--seed", type=int, default=0, help="task seed")
    p.add_argument(
        "--option", action="append", metavar="KEY=VALUE", help="environment option, repeatable (e.g. difficulty=3)"
    )
    add_plugin_flag(p)
    p.set_defaults(func=_cmd_envs_oracle)

    tools = sub.add_parser("tools", help="list the tools, run one by hand").add_subparsers(
        dest="tools_command", required=True
    )
    p = tools.add_parser("list", help="list registered tools (-v: each one's description and arguments)")
    p.add_argument("-v", "--verbose", action="store_true", help="show each tool's description and arguments")
    add_plugin_flag(p)
    p.set_defaults(func=_cmd_tools_list)
    p = tools.add_parser("run", help="run one tool call and print the result as JSON")
    p.add_argument("tool", help="tool name: calculator or python")
    p.add_argument("--expression", help="calculator: the expression")
    p.add_argument("--code", help="python: the code to run in the sandbox")
    p.add_argument("--arg", action="append", metavar="KEY=VALUE", help="any other tool argument, repeatable")
    add_plugin_flag(p)
    p.set_defaults(func=_cmd_tools_run)

    rewards = sub.add_parser("rewards", help="list reward terms").add_subparsers(dest="rewards_command", required=True)
    p = rewards.add_parser("list", help="list registered reward terms and their parameters")
    add_plugin_flag(p)
    p.set_defaults(func=_cmd_rewards_list)

    p = sub.add_parser(
        "eval",
        help="evaluate a model on an environment (pass@1, pass@k, maj@k, tool stats)",
        description="Evaluate a model. Each flag overrides one key of the eval config; every key: `agentic-rl config eval`.",
    )
    add_flagged(p, _EVAL_FLAGS, EvalCommandConfig, "rollout.sampling.top_p=0.9")
    p.add_argument("--json", action="store_true", help="print only the JSON metrics line")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser(
        "chat",
        help="talk to an agent in the terminal; its tool calls run and show as they happen",
        description="A terminal conversation with an agent and its environment's tools. Every key: "
        "`agentic-rl config chat`.",
    )
    add_flagged(p, _CHAT_FLAGS, ChatConfig, "rollout.sampling.top_p=0.9")
    p.set_defaults(func=_cmd_chat)

    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/models) on the rollout engine",
        description="Serve a model with the OpenAI chat-completions API. Without --env, the request's tools "
        "go into the chat template and tool calls come back to the client; with --env, the server runs the "
        "environment's tools and answers with the final reply and its tool trace. Every key: "
        "`agentic-rl config serve`.",
    )
    add_flagged(p, _SERVE_FLAGS, ServeConfig, "batch_window_ms=50")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser(
        "audit",
        help="check that training sees what inference sees: template prefixes, loss masks, "
        "sampler against trainer log-probs, weight sync (exit 1 on a failure)",
        description="Audit a model, its template and an environment before training. Every key: "
        "`agentic-rl config audit`.",
    )
    add_flagged(p, _AUDIT_FLAGS, AuditConfig, "dtypes=[float32]")
    p.set_defaults(func=_cmd_audit)

    p = sub.add_parser(
        "compare", help="paired comparison of two evaluations of the same problems (B − A with its 95%% CI)"
    )
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="A B [B ...]",
        help="A: an `eval --out` file, a pipeline stage folder (e.g. runs/demo/eval_sft) or its DONE.json; "
        "B: the same, for the other model; several B (e.g. one per seed) are each compared, and so is their per-problem mean; "
        "a last row treats each run as one sample (a t-interval over seeds)",
    )
    p.add_argument(
        "--a",
        nargs="+",
        metavar="A",
        help="several A inputs (e.g. one run per seed): A is their per-problem mean; use with --b",
    )
    p.add_argument("--b", nargs="+", metavar="B", help="the B inputs, with --a")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.set_defaults(func=_cmd_compare)

    for name, (_, help_text) in TRAIN_COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=f"{help_text}. Every key: `agentic-rl config {name}`.")
        p.add_argument(
            "--config", help="YAML config file (defaults are used for missing keys; it may `extends:` another file)"
        )
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a key, e.g. optim.lr=1e-5 (repeatable)",
        )
        add_plugin_flag(p)
        p.set_defaults(func=_cmd_train)

    p = sub.add_parser("merge", help="merge LoRA adapters into a standalone HF model directory (transformers, vLLM)")
    p.add_argument("--adapters", required=True, help="a stage's final/ folder with LoRA adapters")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=_cmd_merge)

    p = sub.add_parser("metrics", help="list every metric key the trainers log, with its definition")
    p.add_argument("--markdown", action="store_true", help="as a Markdown page (docs/metrics.md)")
    p.set_defaults(func=_cmd_metrics)

    p = sub.add_parser("config", help="list every key of a command's config with its type, default and meaning")
    p.add_argument("which", nargs="?", choices=sorted(CONFIGURED_COMMANDS), help="the command")
    p.add_argument(
        "--markdown", action="store_true", help="a Markdown page (docs/config.md: every command without `which`)"
    )
    p.set_defaults(func=_cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func

    try:
        return func(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {capped(str(exc))}", file=sys.stderr)
        return 2
    except RunStopped as exc:  # e.g. a non-finite loss: the message names the step and the resume point
        print(f"error: {capped(str(exc))}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
