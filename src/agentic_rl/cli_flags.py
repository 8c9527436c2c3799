"""Command-line flags that set config keys: each flag overrides one key through the one config
loader, so a bad flag fails as a bad key would, and a renamed key's old flag is refused with the new
one's name. Torch-free, like cli.py.
"""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from agentic_rl.config_docs import field_help
from agentic_rl.config_yaml import ConfigBoundError, load_yaml
from agentic_rl.errors import quoted


def parse_options(pairs: list[str] | None, flag: str = "--option") -> dict[str, Any]:
    """`--option key=value` pairs (or `--arg`'s) -> {key: the value read as YAML, as a config
    value is}; a value that is not YAML is a ValueError naming the flag and the pair."""
    options: dict[str, Any] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"error: option '{pair}' must look like key=value")
        key, raw = pair.split("=", 1)
        try:
            options[key] = load_yaml(raw)
        except (yaml.YAMLError, ConfigBoundError) as exc:
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(
                f"{flag} {quoted(pair)}: its value is not YAML ({problem}); quote a string, e.g. "
                f"{flag} '{key}=\"{raw}\"'"
            ) from None
    return options


def load_flagged(args: argparse.Namespace, flags: dict[str, str], cls: type):
    """A command's config: --config, then its flags (each overrides one key; `--option K=V` is
    env.options.K), then --set, all through the one loader and the validation step, so a bad flag
    fails as a bad key would."""
    from agentic_rl.validation import load_and_validate  # local: torch-free

    overrides = [f"{key}={getattr(args, flag)}" for flag, key in flags.items() if getattr(args, flag) is not None]
    overrides += [f"env.options.{pair}" for pair in args.option or []]
    return load_and_validate(cls, args.config, overrides + args.set, plugins=args.plugin)


def add_flagged(p: argparse.ArgumentParser, flags: dict[str, str], cls: type, set_example: str) -> None:
    """--config, one flag per key of `flags` (help and default read from the config class `cls`,
    so no default is written twice), --option and --set."""
    p.add_argument("--config", help="YAML config (it may `extends:` another file); flags and --set override it")
    for flag, key in flags.items():
        p.add_argument(
            f"--{flag.replace('_', '-')}",
            metavar=key.split(".")[-1].upper(),
            help=f"{key}: {field_help(cls, key)}".replace("%", "%%"),
        )
    for old, new in getattr(cls, "RENAMED_KEYS", {}).items():  # an old flag is refused with the new one's name
        p.add_argument(
            f"--{old.replace('_', '-')}",
            action=RenamedFlag,
            help=argparse.SUPPRESS,
            now=f"--{new.split()[0].replace('_', '-')}",
        )
    p.add_argument(
        "--option", action="append", metavar="KEY=VALUE", help="env.options.KEY: environment option, repeatable"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override any key, e.g. {set_example} (repeatable)",
    )
    add_plugin_flag(p)


class RenamedFlag(argparse.Action):
    """A flag whose key was renamed: argparse's usage error, naming the new flag."""

    def __init__(self, option_strings, dest, now: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.now = now

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.now}")


def add_plugin_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import a module (on PYTHONPATH) or a .py file that registers envs, tools or rewards, "
        "before the config is read; appended to the config's `plugins` (repeatable)",
    )


def load_plugin_flags(args: argparse.Namespace) -> None:
    """--plugin on a command without a config (envs, tools, rewards)."""
    from agentic_rl.plugin_loading import load_plugins  # local: torch-free

    load_plugins(args.plugin)
