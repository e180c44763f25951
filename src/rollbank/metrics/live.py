"""Live progress in the terminal (rich), fed by the lifecycle events.

:class:`LiveView` is an :class:`~rollbank.scheduling.policy.events.EventSink`. It keeps running
counts (launched, running, finished by outcome, groups ready, batches, waste) and redraws a
small table at most every ``min_interval_s`` seconds. It never starts a thread: redraws happen
inside :meth:`emit` (``auto_refresh=False``), so nothing outlives :meth:`close`.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rollbank.scheduling.policy.events import AttemptFinished, Event, EventKind


class LiveView:
    def __init__(
        self,
        *,
        total_batches: int,
        groups_per_batch: int,
        console: Console | None = None,
        min_interval_s: float = 0.5,
        title: str = "rollbank collect",
    ) -> None:
        self.total_batches = total_batches
        self.groups_per_batch = groups_per_batch
        self.title = title
        self.counts: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self._min_interval = min_interval_s
        self._last = 0.0
        self._t0: float | None = None
        self._t_last = 0.0
        self._live: Live | None = Live(
            self.render(), console=console or Console(stderr=True), auto_refresh=False,
            transient=False,
        )
        self._live.start()

    def emit(self, event: Event) -> None:
        if self._t0 is None:
            self._t0 = event.t
        self._t_last = event.t
        self.counts[event.kind.value] += 1
        if isinstance(event, AttemptFinished):
            self.outcomes[event.outcome.outcome.value] += 1
        now = time.monotonic()
        force = event.kind is EventKind.BATCH_READY
        if self._live is not None and (force or now - self._last >= self._min_interval):
            self._last = now
            self._live.update(self.render(), refresh=True)

    @property
    def running(self) -> int:
        c = self.counts
        return c["launched"] - c["finished"] - c["aborted"]

    def stats(self) -> dict[str, Any]:
        c = self.counts
        return {
            "elapsed_s": self._t_last - (self._t0 or self._t_last),
            "launched": c["launched"],
            "running": self.running,
            "finished": c["finished"],
            "outcomes": dict(self.outcomes),
            "groups_ready": c["group_ready"],
            "groups_dropped": c["group_dropped"],
            "batches": c["batch_ready"],
            "waste": c["waste"],
            "retried": c["retried"],
        }

    def render(self) -> Table:
        s = self.stats()
        table = Table(title=self.title, show_header=False, expand=False)
        table.add_column("what", style="bold")
        table.add_column("value")
        table.add_row("elapsed", f"{s['elapsed_s']:.1f} s")
        table.add_row("batches", f"{s['batches']} / {self.total_batches}")
        table.add_row("groups ready", f"{s['groups_ready']} (dropped {s['groups_dropped']})")
        table.add_row("attempts", f"launched {s['launched']}  running {s['running']}  "
                                  f"finished {s['finished']}")
        outcomes = "  ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items())) or "-"
        table.add_row("outcomes", outcomes)
        table.add_row("retried / waste", f"{s['retried']} / {s['waste']}")
        return table

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self.render(), refresh=True)
            self._live.stop()
            self._live = None
