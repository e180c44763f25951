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
"""

from __future__ import annotations

import argparse
import enum
import json
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

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


def add_config_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    aliases: Mapping[str, str] | None = None,
    title: str = "configuration (any field of the config; see docs)",
) -> list[Flag]:
    """Add a flag per leaf field of ``model`` (and ``aliases``: ``"--groups": "a.b"``).

    Parsed values land in the namespace under ``dest = "cfg:" + key`` (and the spelling used
    under ``"cfg_flag:" + key``); read them back with :func:`overrides_from`. Returns the flags.
    """
    flags = list(flags_of(model))
    by_key = {f.key: f for f in flags}
    group = parser.add_argument_group(title)
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
        group.add_argument(
            f.option, dest="cfg:" + f.key, metavar=f.metavar, nargs=f.nargs, const="true",
            default=argparse.SUPPRESS, help=f.help, action=_Store,
        )
    return flags


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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
            values[key] = [_parse_value(v) for v in raw] if isinstance(raw, list) else _parse_value(raw)
            origins[key] = getattr(args, "cfg_flag:" + key, "--" + key.replace("_", "-"))
    for item in pairs or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        values[key.strip()] = _parse_value(value)
        origins[key.strip()] = f"--set {key.strip()}"
    return values, origins
