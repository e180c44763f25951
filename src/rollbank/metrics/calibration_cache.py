"""Reuse a recent calibration of the same servers on the same host instead of probing again.

:func:`~rollbank.metrics.calibrate.calibrate` sends probe requests before the collection clock
starts (on a 2-core host running Gemma 3 270M: ~100 s of a ~5 min warm re-run). The measured
rates depend on the host, the model, the dtype, the server count and threads, and the engine
version -- all of which an :class:`~rollbank.inference_plane.InferencePlane` of managed servers
states in its ``fingerprint``. :class:`CalibrationCache` keeps one JSON file per fingerprint
under ``ROLLBANK_CACHE/calibration/`` and hands the stored capacity back while it is younger
than ``max_age_s``.

Invariants
- A cached capacity says so: ``source`` becomes ``"cached:<file name>"`` and the file records
  when it was measured, so a bound built from it is never reported as freshly measured.
- Only measured capacities are stored; the configured slot counts (``sandbox_slots``,
  ``verifier_slots``) are not measurements and always come from the current run.
- An unreadable, stale or mismatching file is treated as absent (never an error): the run
  calibrates again and overwrites it.
- A calibration measured on a busier host than now is treated as absent: its rates are too
  low for this run (the bound would be too loose and the efficiency could exceed 1; seen: a
  calibration taken at load average ~20 on 2 cores, reused on the quiet host, gave efficiency
  3.15). The file records the 1-minute load average per core at measurement; it is reused only
  while the current one is at most ``LOAD_SLACK`` lower. Files without it (schema 1) are absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rollbank.config import cache_dir
from rollbank.metrics.bound import Capacity

SCHEMA = "rollbank.calibration/2"
LOAD_SLACK = 0.5  # runnable tasks per core: how much quieter than at measurement the host may be
_RATES = ("decode_rate_single", "decode_rate_max", "prefill_rate_single", "prefill_rate_max",
          "ttft_floor_s")


def load_per_core() -> float:
    """The host's 1-minute load average per core."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def fingerprint_key(fingerprint: str) -> str:
    """The file stem for ``fingerprint`` (a short content hash)."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:20]


class CalibrationCache:
    """Stored calibrations, one file per inference fingerprint, in ``folder``."""

    def __init__(self, folder: Path, *, max_age_s: float,
                 now: Callable[[], float] = time.time,
                 load: Callable[[], float] = load_per_core) -> None:
        self.folder = folder
        self.max_age_s = max_age_s
        self.now = now
        self.host_load = load

    def path(self, fingerprint: str) -> Path:
        return self.folder / f"{fingerprint_key(fingerprint)}.json"

    def load(self, fingerprint: str, *, sandbox_slots: int,
             verifier_slots: int | None) -> Capacity | None:
        """The stored capacity for ``fingerprint`` if fresh enough, else None."""
        path = self.path(fingerprint)
        try:
            data = json.loads(path.read_text())
            if data.get("schema") != SCHEMA or data.get("fingerprint") != fingerprint:
                return None
            age = self.now() - float(data["measured_at"])
            if not 0 <= age <= self.max_age_s:
                return None
            if self.host_load() < float(data["load_per_core"]) - LOAD_SLACK:
                return None  # measured on a busier host: its rates understate this one
            rates = {k: float(data["capacity"][k]) for k in _RATES}
            return Capacity(**rates, sandbox_slots=sandbox_slots, verifier_slots=verifier_slots,
                            source=f"cached:{path.name}")
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, fingerprint: str, capacity: Capacity) -> Path | None:
        """Record a measured ``capacity`` (others are not stored); the file written, or None."""
        if capacity.source != "measured":
            return None
        data: dict[str, Any] = {
            "schema": SCHEMA, "fingerprint": fingerprint, "measured_at": self.now(),
            "load_per_core": self.host_load(),
            "capacity": {k: getattr(capacity, k) for k in _RATES},
        }
        path = self.path(fingerprint)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            tmp.replace(path)
        except OSError:
            return None
        return path


def calibration_cache(max_age_s: float) -> CalibrationCache | None:
    """The cache under ``ROLLBANK_CACHE/calibration`` (None when ``max_age_s`` is 0: off)."""
    if max_age_s <= 0:
        return None
    return CalibrationCache(cache_dir() / "calibration", max_age_s=max_age_s)


async def calibrate_or_reuse(
    measure: Callable[[], Awaitable[Capacity]], *, cache: CalibrationCache | None,
    fingerprint: str | None, sandbox_slots: int, verifier_slots: int | None,
    on_measure: Callable[[], None] | None = None,
) -> tuple[Capacity, bool]:
    """A cached capacity for ``fingerprint`` if there is a fresh one, else ``measure()`` (then
    stored; ``on_measure`` is called first). Returns the capacity and whether it was measured now."""
    cached = (cache.load(fingerprint, sandbox_slots=sandbox_slots, verifier_slots=verifier_slots)
              if cache is not None and fingerprint is not None else None)
    if cached is not None:
        return cached, False
    if on_measure is not None:
        on_measure()
    capacity = await measure()
    if cache is None or fingerprint is None:
        return capacity, True
    cache.store(fingerprint, dataclasses.replace(capacity))
    return capacity, True
