"""The command line's contract: --version, exit codes, plain help, a closed pipe."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollbank import __version__
from rollbank.cli.main import build_parser, main, plain

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"rollbank {__version__}"


def test_unknown_flag_is_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["collect", "--no-such-flag"])
    assert exc.value.code == 2


def test_help_has_no_rest_markup() -> None:
    assert plain("the ``x`` of :class:`~rollbank.a.Thing`") == "the x of Thing"
    parser = build_parser()
    for name in ("collect", "replay", "serve", "tasks"):
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub = action.choices[name]
        text = sub.format_help()
        assert "``" not in text and ":class:" not in text, name


def test_closed_pipe_is_not_a_traceback() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        f"{sys.executable} -m rollbank.cli.main tasks list terminal-lite | true",
        shell=True, capture_output=True, text=True, env=env, check=False,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_main_runs_off_the_main_thread(tmp_path: Path) -> None:
    """Library callers (and tests) run the CLI in a worker thread, where Python refuses to
    install signal handlers: the SIGTERM handler is the main thread's business only."""
    import threading

    codes: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            codes.append(main(["replay", str(tmp_path / "missing.json")]))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert errors == [] and codes == [3]  # a missing episode file: bad input


def test_serve_waits_for_its_stop_signal_off_the_main_thread() -> None:
    """Regression: `rollbank serve` installed its SIGINT/SIGTERM handlers unconditionally;
    in a worker thread ``add_signal_handler`` raised instead of serving until cancelled."""
    import asyncio
    import signal
    import threading

    from rollbank.cli.serve import wait_for_stop_signal

    async def serve_briefly() -> str:
        waiting = asyncio.create_task(wait_for_stop_signal())
        done, _ = await asyncio.wait({waiting}, timeout=0.2)
        if done:  # it must not end by itself: an error surfaces here
            return repr(waiting.exception())
        waiting.cancel()  # how a worker-thread caller stops it
        return "waiting"

    results: list[str] = []
    worker = threading.Thread(target=lambda: results.append(asyncio.run(serve_briefly())))
    worker.start()
    worker.join()
    assert results == ["waiting"]

    async def control() -> None:  # the main thread: SIGTERM ends the wait
        waiting = asyncio.create_task(wait_for_stop_signal())
        await asyncio.sleep(0)  # handlers installed (never SIGTERM this test run otherwise)
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        signal.raise_signal(signal.SIGTERM)
        await asyncio.wait_for(waiting, 60)

    asyncio.run(control())
