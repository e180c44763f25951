"""`rollbank bench`: the benchmarks come from the rollbank-bench distribution's entry point;
without it the command says how to install them and exits 2 (usage)."""

from __future__ import annotations

import argparse

import pytest

from rollbank.cli import bench


def _parser(found: dict[str, str] | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollbank")
    bench.register(parser.add_subparsers(dest="command"), found)
    return parser


def test_without_the_benchmarks_the_command_says_how_to_install_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser({}).parse_args(["bench", "schedule", "--json"])
    assert args.func(args) == 2
    assert "pip install -e bench/" in capsys.readouterr().err


def test_installed_benchmarks_are_sub_commands() -> None:
    found = bench.benches()
    assert {"sandbox", "schedule", "collect", "faults", "learning"} <= set(found)
    args = _parser(found).parse_args(["bench", "schedule", "--decision-cost", "10", "--json"])
    assert args.decision_cost == 10 and args.func.__module__ == "rollbank_bench.schedule"
