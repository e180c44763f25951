"""Flags generated from pydantic config models (rollbank.cli.flags)."""

from __future__ import annotations

import argparse
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
    help_text = _parser().format_help()
    assert "--inner.size" in help_text and "siblings per group" in help_text
    assert "100% optional" in help_text


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
