"""Flags generated from pydantic config models (rollbank.cli.flags)."""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Literal

import pytest
from pydantic import Field

from rollbank.cli.flags import add_config_flags, flags_of, overrides_from
from rollbank.config import Section
from rollbank.errors import UsageError


class Inner(Section):
    """inner section"""

    size: int = Field(default=4, gt=0, description="siblings per group")
    names: list[str] = Field(default_factory=list, description="task ids")


class Outer(Section):
    """outer"""

    mode: Literal["a", "b"] = Field(default="a", description="the mode")
    inner: Inner = Field(default_factory=Inner, description="inner")
    port: int | None = Field(default=None, description="a port, 100% optional")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_flags(p, Outer, aliases={"--size": "inner.size"})
    return p


def test_every_leaf_becomes_a_flag_with_its_description() -> None:
    flags = {f.key: f for f in flags_of(Outer)}
    assert set(flags) == {"mode", "inner.size", "inner.names", "port"}
    assert flags["inner.size"].option == "--inner.size"
    assert flags["inner.size"].help == "siblings per group"
    assert flags["mode"].metavar == "{a,b}"
    assert flags["inner.names"].is_list
    help_text = _help_all(_parser())
    assert "--inner.size" in help_text and "siblings per group" in help_text
    assert "100% optional" in help_text


def _help_all(parser: argparse.ArgumentParser) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        parser.parse_args(["--help-all"])
    assert done.value.code == 0
    return out.getvalue()


def test_help_has_two_tiers_everyday_flags_first_the_rest_by_part() -> None:
    """Regression: `collect --help` was ~450 lines, everyday flags mixed with gate thresholds
    and router constants. --help shows the aliases and the everyday keys and names the parts
    of the rest; --help-all shows every flag under a heading per part; both still parse."""
    p = argparse.ArgumentParser()
    add_config_flags(p, Outer, aliases={"--size": "inner.size"}, everyday=("mode",))
    short = p.format_help()
    assert "--size" in short and "--mode" in short  # alias and everyday key
    assert "--port" not in short and "--inner.names" not in short
    assert "2 more, by part: inner (1), run (1)" in " ".join(short.split())
    full = _help_all(p)
    assert "--port" in full and "--inner.names" in full
    assert "inner (--inner.*):" in full and "the run (top-level fields):" in full
    args = p.parse_args(["--port", "8", "--inner.names", "a", "b"])  # hidden, still flags
    assert overrides_from(args)[0] == {"port": 8, "inner.names": ["a", "b"]}


def test_values_are_parsed_and_only_given_flags_are_returned() -> None:
    args = _parser().parse_args(["--size", "8", "--inner.names", "x", "y", "--port", "9"])
    values, origins = overrides_from(args, ["mode=b"])
    assert values == {"inner.size": 8, "inner.names": ["x", "y"], "port": 9, "mode": "b"}
    assert origins == {"inner.size": "--size", "inner.names": "--inner.names", "port": "--port",
                       "mode": "--set mode"}
    assert overrides_from(_parser().parse_args([])) == ({}, {})


def test_alias_must_name_a_field() -> None:
    with pytest.raises(ValueError, match="no config field"):
        add_config_flags(argparse.ArgumentParser(), Outer, aliases={"--x": "inner.nope"})


def test_malformed_set_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        overrides_from(argparse.Namespace(), ["nokey"])


def test_a_small_config_shows_every_flag_in_help() -> None:
    """Regression: `rollbank serve --help` (ServerConfig, a handful of fields) had lost every
    field to --help-all: a small config keeps one tier."""
    short = _parser().format_help()
    assert "--port" in short and "--inner.names" in short and "--mode" in short
