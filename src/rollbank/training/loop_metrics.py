"""Prometheus gauges of the training loop, fed by the loop's records (``train.jsonl`` rows).

:class:`TrainGauges` registers on a given ``CollectorRegistry`` (the run's
:class:`~rollbank.metrics.prometheus.PrometheusSink` registry, so one endpoint serves the
collection and the training metrics). Updates are in-memory and O(1).
"""

from __future__ import annotations

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
