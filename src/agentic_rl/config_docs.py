"""Config documentation: the docstring under each field, and `agentic-rl config <command>`'s
listing of every key with its type and the default a run gets (config.py loads and checks;
this reads the same dataclasses).

    for line in describe(GRPOConfig): print(line)
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from agentic_rl.config import Derived, _derived, settings


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass `cls` (string literal after the annotation),
    inherited fields included (a subclass's own docs win)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def field_help(cls: type, key: str) -> str:
    """'doc (default D)' of the dotted `key` of dataclass `cls` (for CLI flags)."""
    *sections, leaf = key.split(".")
    for section in sections:
        field = next(f for f in dataclasses.fields(cls) if f.name == section)
        cls = get_type_hints(cls)[section]
        if get_origin(cls) in (Union, types.UnionType):  # an optional section, e.g. serve's `env: EnvSpec | None`
            cls = next(arg for arg in get_args(cls) if arg is not type(None))
            if field.default is None:  # off by default: its keys' defaults apply once it is set
                return f"{field_docs(cls).get(leaf, '')} (default: none, {section} is unset)"
    return f"{field_docs(cls).get(leaf, '')} (default {_leaf_default(next(f for f in dataclasses.fields(cls) if f.name == leaf))!r})"


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per leaf key: `key (type, default): doc`, recursing into nested configs and into
    the fields of a list's items (`sources[].kind`, after the line of `sources` itself).

    A default is read where it is declared, on the field of its class: a section whose command
    has other defaults is a subclass that redeclares them (GRPOLoopConfig's steps 50), never a
    factory that builds the class with other values (then `describe` would have to build it to
    know them); `check_section_default` refuses such a factory."""
    lines = []
    docs = field_docs(cls)
    hints = get_type_hints(cls)
    marked = get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if _derived(marked[f.name]) is not None:
            continue  # not a key
        if dataclasses.is_dataclass(hint):
            check_section_default(cls, f, hint)
            lines.extend(describe(hint, prefix=f"{prefix}{f.name}."))
            continue
        type_name = type_label(marked[f.name])
        lines.append(
            f"{prefix}{f.name} ({type_name}, default {_shown_default(_leaf_default(f))}): {docs.get(f.name, '')}"
        )
        item = get_args(hint)[0] if get_origin(hint) is list and get_args(hint) else None
        if dataclasses.is_dataclass(item):  # what each item of the list may hold: `sources[].kind`
            lines.extend(describe(item, prefix=f"{prefix}{f.name}[]."))
    return lines


def markdown_reference(described: dict[str, list[str]]) -> str:
    """A Markdown page of `describe` lines by command (`agentic-rl config --markdown`): a section
    per command, a bullet per key, the key and its type and default set apart from the text."""
    out = [
        "# Config reference",
        "",
        "Every key of every command's config, generated from the code by `agentic-rl config --markdown`;",
        "`agentic-rl config <command>` prints one command's. Set a key in a YAML file (`--config`) or with",
        "`--set key=value`; `name[].key` is a key of each item of the list `name`.",
        "",
    ]
    for command, lines in described.items():
        out += [f"## {command}", ""]
        for line in lines:
            key, rest = line.split(" (", 1)
            spec, doc = rest.split("): ", 1)
            out.append(f"- **`{key}`** ({markdown_text(spec.replace('`', ''))}): {markdown_text(doc)}")
        out.append("")
    return "\n".join(out)


def markdown_text(text: str) -> str:
    """`text` safe in Markdown: outside its `code spans`, <, > and * as entities (a doc's `<think>`
    would be read as HTML and vanish, a `*` start emphasis); a code span is left as written."""
    parts = text.split("`")
    for index in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[index] = (
            parts[index].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "&#42;")
        )
    return "`".join(parts)


def type_label(hint: Any) -> str:
    """A field's type as a user reads it: a Literal as its choices (`one of float32, bfloat16, auto`),
    an Optional as `X or null`, a list by its item type, a marked number with its bound (`int > 0`,
    `float in [0, 1)`); else the type's name."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        bounds = [repr(mark) for mark in args[1:] if not isinstance(mark, Derived)]
        return " ".join([type_label(args[0]), *bounds])
    if origin is Literal:
        return "one of " + ", ".join(str(arg) for arg in args)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if arg is type(None) else type_label(arg) for arg in args)
    if origin in (list, tuple) and args:
        item = args[0]
        return f"list of {item.__name__ if dataclasses.is_dataclass(item) else type_label(item)}"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_section_default(cls: type, field: dataclasses.Field, section: type) -> None:
    """TypeError unless the nested section `field` of `cls` defaults to its class's own defaults
    (default_factory is the class itself): each default is declared once, where it is read."""
    if field.default_factory is not section:  # type: ignore[misc]
        raise TypeError(
            f"{cls.__name__}.{field.name}: a section's default must be default_factory={section.__name__}, its "
            "class's own defaults; declare a subclass that redeclares the fields whose default differs"
        )


def _shown_default(value: Any) -> str:
    """A default as it is written in a config: a list of sections in YAML's flow style
    (`[{name: env_steps, weight: 1.0, params: {}}]`), a scalar as its repr."""
    if isinstance(value, list) and any(dataclasses.is_dataclass(item) for item in value):
        plain = [settings(item) if dataclasses.is_dataclass(item) else item for item in value]
        return yaml.safe_dump(plain, default_flow_style=True, sort_keys=False, width=10**6).strip()
    return repr(value)


def _leaf_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else "required"  # type: ignore[misc]
