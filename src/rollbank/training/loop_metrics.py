"""What the training loop reports: ``train.jsonl`` rows, a progress line, Prometheus gauges.

:class:`TrainGauges` registers on a given ``CollectorRegistry`` (the run's
:class:`~rollbank.metrics.prometheus.PrometheusSink` registry, so one endpoint serves the
collection and the training metrics). Updates are in-memory and O(1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge


class TrainGauges:
    """A record callback: ``step``, ``stale`` and ``publication`` records update the gauges."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.trainer_version = Gauge("rollbank_train_version", "weight version of the trainer", registry=r)
        self.served_version = Gauge("rollbank_train_served_version",
                                    "weight version every engine serves", registry=r)
        self.reward = Gauge("rollbank_train_reward_mean", "mean reward of the last trained batch", registry=r)
        self.loss = Gauge("rollbank_train_loss", "loss of the last step", registry=r)
        self.clip = Gauge("rollbank_train_clip_fraction", "clip fraction of the last step", registry=r)
        self.age = Gauge("rollbank_train_policy_age", "policy age of the last batch (versions)", registry=r)
        self.step_s = Gauge("rollbank_train_step_seconds", "wall time of the last step", registry=r)
        self.publication_s = Gauge("rollbank_publication_seconds",
                                   "last publication: step done -> every engine serving", registry=r)
        self.pause_s = Gauge("rollbank_publication_apply_pause_seconds",
                             "last publication: time generation was stopped", registry=r)
        self.stale = Counter("rollbank_train_stale_batches", "batches older than max_lag, not trained on",
                             registry=r)

    def __call__(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "step":
            self.trainer_version.set(record["version"])
            self.reward.set(record["reward_mean"])
            self.loss.set(record.get("loss", 0.0))
            self.clip.set(record.get("clip_fraction", 0.0))
            self.age.set(record["policy_age"])
            self.step_s.set(record["step_s"])
        elif kind == "stale":
            self.stale.inc()
            self.age.set(record["policy_age"])
        elif kind == "publication":
            self.served_version.set(record["version"])
            self.publication_s.set(record["publication_s"])
            self.pause_s.set(record["apply_pause_s"])


def gate_record(staleness: Any) -> dict[str, Any]:
    """The divergence gate's decisions on one batch, for its ``train.jsonl`` step record.

    ``staleness`` is the batch's :class:`~rollbank.batching.batch.StalenessColumns` (None when
    the gate did not run in collection: ``{"enabled": false}``). Otherwise its report's counters
    (admitted / downweighted / retried / excluded / rare_success_kept / unmeasured / groups /
    groups_with_retry / reasons), the scorer, the version it scored at, the mean weight of the
    kept rows and the k3 pooled over the batch's model tokens."""
    if staleness is None:
        return {"enabled": False}
    report = staleness.report
    tokens = (report.get("divergence") or {}).get("tokens") or {}
    return {"enabled": True, **report.get("gate", {}), "scorer": report.get("scorer"),
            "current_version": report.get("current_version"),
            "weight_mean": report.get("weight_mean"), "k3": tokens.get("k3")}


def progress_line(rec: dict[str, Any], total: int) -> str:
    """The plain progress line of one step record."""
    pub = rec.get("publication_s")
    tail = (f" publish {pub:.2f}s pause {rec['apply_pause_s']:.2f}s" if pub is not None
            else " publishing in background")
    gate = rec.get("gate") or {}
    gated = (f" gate admit {gate.get('admitted', 0)} down {gate.get('downweighted', 0)} "
             f"retry {gate.get('retried', 0)} excl {gate.get('excluded', 0)}"
             if gate.get("enabled") else "")
    return (f"step {rec['version']}/{total} batch {rec['batch_index']}: reward "
            f"{rec['reward_mean']:.3f} loss {rec.get('loss', 0.0):.4f} clip "
            f"{rec.get('clip_fraction', 0.0):.3f} age {rec['policy_age']} versions "
            f"{sorted(int(v) for v in rec['versions'])}{gated} train {rec['train_s']:.2f}s{tail} "
            f"step {rec['step_s']:.2f}s")


class JsonlRecorder:
    """Appends one JSON object per line to ``path`` (the run's ``train.jsonl``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
