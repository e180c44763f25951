"""A Prometheus endpoint for long collections, fed by the lifecycle events.

:class:`PrometheusSink` is an :class:`~rollbank.scheduling.policy.events.EventSink`: it turns every
event into counter, gauge and histogram updates on its own ``CollectorRegistry`` (never the
process-global one, so several collectors or tests can coexist). :meth:`serve` exposes the
registry over HTTP (``prometheus_client.start_http_server``, a daemon thread owned by the
library); :meth:`close` shuts it down.

Per-batch staleness (issue #11): :meth:`PrometheusSink.observe_staleness` sets one gauge per
numeric scalar of the batch's staleness report (names from
:func:`rollbank.staleness.report.prometheus_samples`, e.g. ``rollbank_staleness_divergence_
tokens_k3``, ``..._percentiles_p99``, ``..._frac_beyond_0_1``, ``..._version_lag_histogram_2``);
a gauge the newest report lacks (an unmeasured batch, a lag that no longer occurs) is set to
NaN, so a scrape never shows an old batch's value as current.

Invariants
- ``rollbank_attempts_in_flight`` = launched - (finished + aborted) at every moment.
- Updates are in-memory and O(1): the sink never blocks the driver.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

from rollbank.scheduling.policy.events import (
    AttemptFinished,
    AttemptWaste,
    BatchEvent,
    Event,
    EventKind,
)
from rollbank.staleness.report import prometheus_samples

_DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class PrometheusSink:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.attempts = Counter("rollbank_attempt_events", "attempt lifecycle events",
                                ["event"], registry=r)
        self.outcomes = Counter("rollbank_outcomes", "finished attempts by outcome and reason",
                                ["outcome", "reason"], registry=r)
        self.waste = Counter("rollbank_waste", "attempts settled as waste", ["reason"],
                             registry=r)
        self.waste_s = Counter("rollbank_waste_sandbox_seconds",
                               "sandbox-slot seconds held by wasted attempts", registry=r)
        self.in_flight = Gauge("rollbank_attempts_in_flight", "attempts running now", registry=r)
        self.groups = Counter("rollbank_groups", "groups by fate", ["fate"], registry=r)
        self.batches = Counter("rollbank_batches", "batches handed to the trainer", registry=r)
        self.model_tokens = Counter("rollbank_model_tokens", "tokens sampled by the model",
                                    registry=r)
        self.episode_s = Histogram("rollbank_episode_duration_seconds",
                                   "launch-to-finish time of attempts", registry=r,
                                   buckets=_DURATION_BUCKETS)
        self.batch_s = Histogram("rollbank_time_to_batch_seconds",
                                 "time from batch window open to batch ready", registry=r,
                                 buckets=_DURATION_BUCKETS)
        self.staleness_batch = Gauge("rollbank_staleness_batch_index",
                                     "index of the batch the staleness gauges describe", registry=r)
        self._staleness: dict[str, Gauge] = {}
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def emit(self, event: Event) -> None:
        kind = event.kind
        if kind in _ATTEMPT_KINDS:
            self.attempts.labels(kind.value).inc()
        if kind is EventKind.LAUNCHED:
            self.in_flight.inc()
        elif kind is EventKind.ABORTED:
            self.in_flight.dec()
        elif kind is EventKind.FINISHED and isinstance(event, AttemptFinished):
            self.in_flight.dec()
            self.outcomes.labels(event.outcome.outcome.value, event.outcome.reason.value).inc()
            self.model_tokens.inc(event.model_tokens)
            self.episode_s.observe(event.duration_s)
        elif kind is EventKind.WASTE and isinstance(event, AttemptWaste):
            self.waste.labels(event.reason.value).inc()
            self.waste_s.inc(max(event.held_s, 0.0))
        elif kind is EventKind.GROUP_READY:
            self.groups.labels("ready").inc()
        elif kind is EventKind.GROUP_DROPPED:
            self.groups.labels("dropped").inc()
        elif kind is EventKind.BATCH_READY and isinstance(event, BatchEvent):
            self.batches.inc()
            self.batch_s.observe(max(event.t - event.window_start, 0.0))

    def observe_staleness(self, batch_index: int, report: Mapping[str, Any] | None) -> dict[str, float]:
        """Set the staleness gauges from one batch's report (None: unmeasured); returns the
        samples that were set."""
        samples = prometheus_samples(report) if report is not None else {}
        for name, value in samples.items():
            gauge = self._staleness.get(name)
            if gauge is None:
                gauge = Gauge(name, "per-batch staleness report scalar (rollbank.staleness.report)",
                              registry=self.registry)
                self._staleness[name] = gauge
            gauge.set(value)
        for name, gauge in self._staleness.items():
            if name not in samples:
                gauge.set(math.nan)
        self.staleness_batch.set(batch_index)
        return samples

    def exposition(self) -> bytes:
        """The current metrics in the Prometheus text format."""
        data: bytes = generate_latest(self.registry)
        return data

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the bound port (pass 0 for any free port)."""
        server, thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server, self._thread = server, thread
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


_ATTEMPT_KINDS = frozenset(
    {EventKind.LAUNCHED, EventKind.STARTED, EventKind.FINISHED, EventKind.RETRIED,
     EventKind.CARRIED, EventKind.ABORTED, EventKind.WASTE}
)
