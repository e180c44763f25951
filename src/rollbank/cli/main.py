"""`rollbank` command line. Thin: each sub-command module registers itself and imports its
heavy dependencies lazily inside its handler, so `rollbank --help` stays instant.

Exit codes (every command): 0 ok; 1 the run failed (a :class:`~rollbank.errors.RollbankError`
that is not about input, e.g. a server that never became healthy); 2 usage (unknown flag,
malformed value on the command line); 3 bad input (a task, config or episode file, named in
the message); 130 interrupted (SIGINT, Ctrl-C); 143 terminated (SIGTERM). Errors go to stderr
as one line ``rollbank CMD: error: ...``.

SIGTERM is handled like SIGINT (:func:`_on_sigterm`): inside ``asyncio.run`` the main task is
cancelled, so every resource's clean-up runs (managed servers' whole process groups stopped,
sandboxes closed) before the command exits with 143; a second signal interrupts the clean-up
and the ``atexit`` hook and watchdog of :mod:`rollbank.inference.process_groups` kill what is
left (they also cover SIGKILL).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from rollbank import __version__

# Each module exposes `register(subparsers)`; handlers are set with `set_defaults(func=...)`
# and return a process exit code.
COMMAND_MODULES = (
    "rollbank.cli.tasks",
    "rollbank.cli.serve",
    "rollbank.cli.serve_collector",
    "rollbank.cli.serve_gateway",
    "rollbank.cli.collect",
    "rollbank.cli.train",
    "rollbank.cli.eval",
    "rollbank.cli.replay",
    "rollbank.cli.bench",
    "rollbank.cli.numerics",
)

_REST = re.compile(r"``([^`]+)``|:(?:class|func|meth|attr|mod):`~?([^`]+)`")


def plain(text: str | None) -> str:
    """A docstring as help text: reST inline markup (````x````, ``:class:`y```) made plain."""
    return _REST.sub(lambda m: m.group(1) or m.group(2).rsplit(".", 1)[-1], text or "")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the paragraphs of a description; strips reST markup from every help text."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain(super()._expand_help(action))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollbank",
        description="Collect agentic-RL rollouts and hand a trainer complete GRPO batches.",
        formatter_class=HelpFormatter,
        epilog="exit codes: 0 ok, 1 run failed, 2 usage, 3 bad input, 130 interrupted (SIGINT), "
               "143 terminated (SIGTERM)",
    )
    parser.add_argument("--version", action="version", version=f"rollbank {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for action in sub.choices.values():
        _set_formatter(action)
    return parser


def _set_formatter(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _set_formatter(child)


_terminated: list[int] = []  # SIGTERM received (its exit code is 143, not 130)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM takes SIGINT's path: whatever handles SIGINT now (``asyncio.run``'s handler
    cancels the main task so clean-up runs; outside it, KeyboardInterrupt) handles it."""
    _terminated.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signum, frame)


def main(argv: Sequence[str] | None = None) -> int:
    # Python installs signal handlers from the main thread only; a caller that runs the CLI
    # in a worker thread keeps its own SIGTERM handling.
    install = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    if install:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv)
    finally:
        if install:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _main(argv: Sequence[str] | None) -> int:
    from rollbank.errors import RollbankError, rollbank_error_in

    _terminated.clear()
    parser = build_parser()
    args = parser.parse_args(argv)
    command = " ".join(str(getattr(args, k)) for k in ("command",) if getattr(args, k, None))
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except RollbankError as exc:
        print(f"rollbank {command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BaseExceptionGroup as group:  # a TaskGroup wrapped the error that ended the run
        err = rollbank_error_in(group)
        if err is None:
            raise
        print(f"rollbank {command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        if _terminated:
            print(f"rollbank {command}: terminated", file=sys.stderr)
            return 143
        print(f"rollbank {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`rollbank tasks list | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
