"""The evidence of a counterfactual experiment (data only; gathered by ``counterfactual.py``,
judged by ``attribution.py``).

- :class:`VerifierVerdict`: what a verifier said.
- :class:`Probe`: a trivial command under a short wall-clock deadline, on one sandbox.
- :class:`ReplayEvidence`: the episode's recorded model actions re-run, with the same
  per-step limits, on a fresh fork of the task's pristine snapshot, the fork probed after
  every step: does the model's own doing break a sandbox the way the episode's broke?
- :class:`DiskProbe`: the free space of a sandbox's writable layer (and, on a pristine fork,
  whether a small file can be written there).
- :class:`Experiment`: all of it for one episode, as recorded in the outcome's evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollbank.episodes.outcome import Reason


@dataclass(frozen=True)
class VerifierVerdict:
    """What the verifier said, reduced to what attribution needs.

    ``error`` is one of the verifier infra reasons (crash, timeout, no reward, host stalled)
    when the verifier itself failed; then ``reward`` is None.
    """

    reward: float | None
    rewards: dict[str, float] = field(default_factory=dict)
    passed: bool = False
    error: Reason | None = None
    detail: str = ""
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"reward": self.reward, "passed": self.passed,
                "error": self.error.value if self.error else None,
                "duration_s": round(self.duration_s, 3), "detail": self.detail[-500:]}


class ProbeState(StrEnum):
    """What a trivial command under a short deadline found."""

    OK = "ok"  # answered, exit 0
    FAILED = "failed"  # answered, but the command failed (missing shell, permissions...)
    TIMED_OUT = "timed_out"  # no answer within the deadline (a stall, or a hang)
    DEAD = "dead"  # the runtime is gone (or a fresh fork could not even start)
    NOT_RUN = "not_run"  # the experiment was not possible (no pristine source)


@dataclass(frozen=True)
class Probe:
    state: ProbeState
    duration_s: float = 0.0
    detail: str = ""

    @property
    def answered(self) -> bool:
        return self.state in (ProbeState.OK, ProbeState.FAILED)

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "duration_s": round(self.duration_s, 3),
                "detail": self.detail[-500:]}


#: A writable layer with less free space than this (bytes) is full: the write that failed
#: needed a page or a block, and a sandbox cannot work in what is left.
DISK_FULL_BYTES = 1 << 20


@dataclass(frozen=True)
class DiskProbe:
    """Free space of a sandbox's writable layer (``stat -f /``: the overlay reports its upper
    layer's filesystem). ``wrote``: a small file could be written at ``/`` (pristine forks
    only; None when not tried). ``free_bytes`` None: the space could not be read."""

    free_bytes: int | None = None
    total_bytes: int | None = None
    wrote: bool | None = None
    detail: str = ""

    @property
    def full(self) -> bool | None:
        """True: no room to work in; None: could not tell (a failed write with room left
        failed for another reason)."""
        if self.wrote:
            return False
        if self.free_bytes is None:
            return None
        low = self.free_bytes < DISK_FULL_BYTES
        return low if self.wrote is None or low else None

    def describe(self) -> str:
        if self.free_bytes is None:
            return "free space unknown"
        total = f" of {self.total_bytes} B" if self.total_bytes is not None else ""
        return f"{self.free_bytes} B free{total}"

    def to_dict(self) -> dict[str, Any]:
        return {"free_bytes": self.free_bytes, "total_bytes": self.total_bytes,
                "wrote": self.wrote, "full": self.full, "detail": self.detail[-300:]}


class ReplayState(StrEnum):
    """What re-running the model's recorded actions on a pristine fork showed."""

    REPRODUCED = "reproduced"  # the fork died or failed the probe after a replayed step
    HEALTHY = "healthy"  # every recorded step replayed and the fork still answers the probe
    INCONCLUSIVE = "inconclusive"  # cut by the cap, or the host stalled a replayed command
    NOT_RUN = "not_run"  # no fork could start, or no replay was possible


@dataclass(frozen=True)
class ReplayEvidence:
    """The replay's result. ``broke_after`` is the step index after which the fork broke
    (``"verify"`` when it broke while the replayed fork was verified); ``steps`` holds each
    replayed step's timings and exit status, ``fork_probe`` the probe that decided."""

    state: ReplayState
    broke_after: int | str | None = None
    broke_command: str | None = None
    fork_probe: Probe | None = None
    steps_total: int = 0
    steps: tuple[dict[str, Any], ...] = ()
    verified: bool = False  # the verifier was re-run on the replayed fork too
    memory_limit_hit: bool = False  # during a replayed command
    pids_limit_hit: bool = False
    duration_s: float = 0.0
    cap_s: float | None = None
    detail: str = ""
    fork_disk: DiskProbe | None = None  # the replayed fork's free space (disk experiment)

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.value, "broke_after": self.broke_after,
            "broke_command": self.broke_command[:300] if self.broke_command else None,
            "fork_probe": self.fork_probe.to_dict() if self.fork_probe else None,
            "steps_total": self.steps_total, "steps_run": len(self.steps),
            "steps": list(self.steps), "verified": self.verified,
            "memory_limit_hit": self.memory_limit_hit, "pids_limit_hit": self.pids_limit_hit,
            "duration_s": round(self.duration_s, 3), "cap_s": self.cap_s,
            "detail": self.detail[-500:],
            "fork_disk": self.fork_disk.to_dict() if self.fork_disk else None,
        }


#: A verifier timeout is not judged when the pristine re-verify itself used this share of
#: the timeout, or ran this many times slower than ``tasks validate`` measured: the host is too
#: slow now to tell a model's loop from a slow machine.
SLOW_SHARE = 0.5
SLOW_FACTOR = 4.0


@dataclass(frozen=True)
class Experiment:
    """Evidence of the counterfactual experiment (what a person needs to check the verdict).

    ``episode``: probe of the episode's sandbox. ``pristine``: probe of a fresh fork of the
    task's pristine snapshot. ``pristine_verdict``: the verifier re-run on a fresh fork under
    the same limits (None if not run). ``baseline_verify_s``: the no-op verifier time
    recorded by ``tasks validate`` (None if the task was not validated on this machine).
    ``replay``: the model's actions re-run on a fresh fork (only when the episode's sandbox
    stopped answering while a pristine one answers, or its writable layer is full while a
    pristine fork's is not). ``episode_disk`` / ``pristine_disk``: the disk experiment (a
    failure with the episode's writable layer full): its free space, and whether a fresh
    pristine fork can write a small file.
    """

    episode: Probe | None = None
    pristine: Probe | None = None
    pristine_verdict: VerifierVerdict | None = None
    pristine_error: str | None = None  # why the re-verify could not run
    verifier_timeout_s: float | None = None
    baseline_verify_s: float | None = None
    cost_s: float = 0.0
    replay: ReplayEvidence | None = None
    episode_disk: DiskProbe | None = None
    pristine_disk: DiskProbe | None = None

    def host_slow(self) -> bool:
        """Was the pristine re-verify too slow to judge a verifier timeout by?"""
        v = self.pristine_verdict
        if v is None:
            return False
        if self.verifier_timeout_s and v.duration_s >= SLOW_SHARE * self.verifier_timeout_s:
            return True
        b = self.baseline_verify_s
        return b is not None and v.duration_s > SLOW_FACTOR * b + 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode_probe": self.episode.to_dict() if self.episode else None,
            "pristine_probe": self.pristine.to_dict() if self.pristine else None,
            "pristine_verify": self.pristine_verdict.to_dict() if self.pristine_verdict else None,
            "pristine_error": self.pristine_error,
            "verifier_timeout_s": self.verifier_timeout_s,
            "baseline_verify_s": self.baseline_verify_s,
            "host_slow": self.host_slow(),
            "replay": self.replay.to_dict() if self.replay else None,
            "episode_disk": self.episode_disk.to_dict() if self.episode_disk else None,
            "pristine_disk": self.pristine_disk.to_dict() if self.pristine_disk else None,
            "cost_s": round(self.cost_s, 3),
        }
