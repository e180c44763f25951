"""`collect --help` / `eval --help` / `train --help`: the everyday flags, nothing offered then refused."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from rollbank.cli import collect, eval, train


def _sub(register: object) -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="rollbank")
    sub = root.add_subparsers()
    register(sub)  # type: ignore[operator]
    (parser,) = sub.choices.values()
    return parser


@pytest.mark.parametrize("module", [collect, eval])
def test_help_shows_about_a_dozen_everyday_flags_and_help_all_the_rest(module: object) -> None:
    """Regression: `collect --help` and `eval --help` were ~450 lines each."""
    parser = _sub(module.register)  # type: ignore[attr-defined]
    short = parser.format_help()
    options = [ln for ln in short.splitlines() if ln.startswith("  -")]
    assert 8 <= len(options) <= 18, options
    assert "--scheduler.bank.dynamic-sampling" not in short and "--help-all" in short
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args(["--help-all"])
    assert "scheduler (--scheduler.*):" in out.getvalue()
    assert "--staleness." in out.getvalue()


def test_train_offers_every_publisher_the_loop_runs() -> None:
    """`train --help` offers exactly the patterns the loop runs: colocated too, now that the
    loop runs it (it was refused, and then not offered); an unknown one is a usage error."""
    parser = _sub(train.register)
    assert "colocated" in parser.format_help()
    assert parser.parse_args(["--publisher", "colocated"]).publisher == "colocated"
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit) as done:
        parser.parse_args(["--publisher", "shm"])
    assert done.value.code == 2
    assert parser.parse_args(["--publisher", "lora"]).publisher == "lora"


def test_train_prints_plain_lines_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the embedded train config has ``collect.metrics.live = "off"``, so off a
    terminal `rollbank train` printed nothing but progress bars until its first step."""
    from rollbank.training.loop_config import load_train_config

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    logged = load_train_config(None, train.for_stream({}, tty=False))
    assert logged.collect.metrics.live == "auto"
    import os

    assert os.environ.get("TQDM_DISABLE") == "1"
    assert load_train_config(None, train.for_stream({}, tty=True)).collect.metrics.live == "off"
    kept = train.for_stream({"collect.metrics.live": "off"}, tty=False)
    assert kept["collect.metrics.live"] == "off"  # an explicit choice stands
