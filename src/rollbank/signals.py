"""SIGINT/SIGTERM as a stop request on the running event loop, from the main thread only.

Python installs signal handlers from the main thread only (elsewhere ``add_signal_handler``
raises): a caller that runs a command in a worker thread keeps its own signal handling and
stops the command by its other ends (cancellation, the service's stop request).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

__all__ = ["stop_on_signals", "stop_on_signals_with"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """SIGINT/SIGTERM call ``stop`` on the running loop; returns the undo (a no-op off the
    main thread, where nothing is installed)."""
    return stop_on_signals_with(lambda _signum: stop())


def stop_on_signals_with(stop: Callable[[int], None]) -> Callable[[], None]:
    """:func:`stop_on_signals`, ``stop`` called with the signal's number (a command that
    exits 130 or 143 by it)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, int(sig))

    def undo() -> None:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)

    return undo
