"""Command-line flags generated from a pydantic config model.

Every leaf field of a config model becomes a ``--section.field`` flag (underscores written as
dashes: ``--scheduler.groups-per-batch``) whose help text is the field's ``description``. A
command may add short aliases (``--groups`` for ``scheduler.groups_per_batch``); an alias takes
its help and its target from the model, so a flag cannot drift from the config it sets.

Values are parsed as JSON when they parse (``3``, ``true``, ``["a","b"]``), else kept as the
string, and validated by the model itself: a bad value is reported as the flag that carried it
(``--groups: Input should be greater than 0``), never as an error in the TOML file. Why not
pydantic-settings' CLI source or tyro: both build the whole parser eagerly from the model and
own ``--help``; rollbank keeps ``rollbank --help`` instant (sub-commands import lazily) and
needs the flag -> field mapping to report errors by flag. This module is the whole mechanism.

Help comes in two tiers: ``--help`` shows the command's own flags and the everyday ones (the
aliases and any ``everyday`` keys) and names the parts the other flags belong to; ``--help-all``
shows every flag, grouped under a heading per part of the config (``scheduler``, ``inference``,
``sandbox``...).
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rollbank.config import parse_flag_value
from rollbank.errors import UsageError


@dataclass(frozen=True)
class Flag:
    """One generated flag: ``--dotted.key`` (and aliases) for the config field ``key``."""

    key: str  # dotted field path, e.g. "scheduler.groups_per_batch"
    help: str
    metavar: str
    is_list: bool
    is_bool: bool = False  # ``--flag`` alone means true; ``--flag false`` also works

    @property
    def nargs(self) -> str | None:
        return "+" if self.is_list else "?" if self.is_bool else None

    @property
    def option(self) -> str:
        return "--" + self.key.replace("_", "-")


def _model_type(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (``Model`` or ``Model | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return _model_type(inner[0])
    return None


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(annotation) if a is not type(None))
    return typing.get_origin(annotation) in (list, tuple, set, frozenset)


def _metavar(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(annotation)) + "}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "{" + ",".join(str(m.value) for m in annotation) + "}"
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return _metavar(inner[0])
    if origin in (list, tuple, set, frozenset):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return _metavar(args[0]) if args else "VALUE"
    name = getattr(annotation, "__name__", None)
    return {"int": "N", "float": "X", "bool": "BOOL", "str": "TEXT"}.get(name or "", "VALUE")


def flags_of(model: type[BaseModel], prefix: str = "") -> Iterator[Flag]:
    """Every leaf field of ``model`` (recursively), in declaration order."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _model_type(field.annotation)
        if sub is not None:
            yield from flags_of(sub, key + ".")
            continue
        yield Flag(
            key=key,
            help=(field.description or "").replace("%", "%%"),
            metavar=_metavar(field.annotation),
            is_list=_is_list(field.annotation),
            is_bool=field.annotation is bool,
        )


class _Store(argparse.Action):
    """Store the value and remember which spelling of the flag gave it (for error messages)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, "cfg_flag:" + self.dest[4:], option_string or self.dest[4:])


#: a config with at most this many fields shows them all in ``--help`` (one tier)
SMALL_CONFIG = 24


class _HelpAll(argparse.Action):
    """``--help-all``: give the hidden flags their help back, print the help, exit."""

    def __init__(self, option_strings: list[str], dest: str, *,
                 hidden: list[tuple[argparse.Action, str]], **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show every flag, grouped by part of the configuration, and exit")
        self.hidden = hidden

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        for action, text in self.hidden:
            action.help = text
        parser.epilog = None
        parser.print_help()
        parser.exit()


def part_of(key: str) -> str:
    """The part of the config a dotted key belongs to (its first section; ``run`` for the
    top-level fields)."""
    return key.split(".", 1)[0] if "." in key else "run"


def add_config_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    aliases: Mapping[str, str] | None = None,
    title: str = "configuration (any field of the config; see docs)",
    everyday: tuple[str, ...] | None = None,
) -> list[Flag]:
    """Add a flag per leaf field of ``model`` (and ``aliases``: ``"--groups": "a.b"``).

    Parsed values land in the namespace under ``dest = "cfg:" + key`` (and the spelling used
    under ``"cfg_flag:" + key``); read them back with :func:`overrides_from`. Returns the flags.
    The aliases and the ``everyday`` keys (None: every key of a model with at most
    ``SMALL_CONFIG`` fields or without sections, none of a bigger one) are listed by ``--help``; every other flag only by
    ``--help-all``, under a heading per part (``title``: kept for callers, unused).
    """
    flags = list(flags_of(model))
    by_key = {f.key: f for f in flags}
    groups: dict[str, argparse._ArgumentGroup] = {}
    one_tier = len(flags) <= SMALL_CONFIG or len({part_of(f.key) for f in flags}) == 1
    hidden: list[tuple[argparse.Action, str]] = []
    for alias, key in (aliases or {}).items():
        if key not in by_key:
            raise ValueError(f"alias {alias} names no config field {key!r}")
        f = by_key[key]
        parser.add_argument(
            alias, dest="cfg:" + key, metavar=f.metavar, nargs=f.nargs, const="true",
            default=argparse.SUPPRESS, action=_Store,
            help=f.help if alias == f.option else f"{f.help} (= {f.option})",
        )
    for f in flags:
        if f.option in (aliases or {}):
            continue  # the alias is this very spelling
        part = part_of(f.key)
        if part not in groups:
            groups[part] = parser.add_argument_group(
                f"{part} (--{part}.*)" if part != "run" else "the run (top-level fields)")
        shown = f.key in everyday if everyday is not None else one_tier
        action = groups[part].add_argument(
            f.option, dest="cfg:" + f.key, metavar=f.metavar, nargs=f.nargs, const="true",
            default=argparse.SUPPRESS, help=f.help if shown else argparse.SUPPRESS, action=_Store,
        )
        if not shown:
            hidden.append((action, f.help))
    parser.add_argument("--help-all", action=_HelpAll, hidden=hidden)
    counts: dict[str, int] = {}
    for action, _ in hidden:
        if action.dest[4:] not in (aliases or {}).values():  # an alias names it in --help
            part = part_of(action.dest[4:])
            counts[part] = counts.get(part, 0) + 1
    parts = ", ".join(f"{p} ({n})" for p, n in counts.items())
    if not counts:
        return flags
    parser.epilog = ((parser.epilog + "\n\n") if parser.epilog else "") + (
        f"Every field of the configuration is a flag too: {sum(counts.values())} "
        f"more, by part: {parts}. --help-all lists them all, grouped by part.")
    return flags


def overrides_from(args: argparse.Namespace, pairs: list[str] | None = None
                   ) -> tuple[dict[str, Any], dict[str, str]]:
    """The config flags given on the line (and ``--set KEY=VALUE`` ``pairs``, applied last).

    Returns ``(overrides, origins)``: dotted key -> value, and dotted key -> the flag that
    gave it (what an error about that value names).
    """
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for dest, raw in vars(args).items():
        if dest.startswith("cfg:"):
            key = dest[4:]
            origins[key] = getattr(args, "cfg_flag:" + key, "--" + key.replace("_", "-"))
            values[key] = ([parse_flag_value(v, origins[key]) for v in raw] if isinstance(raw, list)
                           else parse_flag_value(raw, origins[key]))
    for item in pairs or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        origins[key.strip()] = f"--set {key.strip()}"
        values[key.strip()] = parse_flag_value(value, origins[key.strip()])
    return values, origins
