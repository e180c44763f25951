"""The campaign's verdicts (pure): per-fault attribution, batches, the ledger.

- attribution: each injected fault's attempt ended with an outcome its kind allows
  (:data:`.kinds.EXPECT`); attempts without a fault ended trainable unless a fault window
  (an engine restarting, a port down) explains an ``inference_error``;
- batches: every group delivered has only valid siblings (one per slot), ``valid +
  infra_final == size``, at least ``min_valid`` valid, and advantages equal to GRPO over
  exactly those siblings' rewards;
- ledger: launched == consumed + retried + waste with nothing left open; every finished
  attempt id appears once.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollbank.batching.advantages import grpo_advantages, is_valid, reward_of
from rollbank.batching.batch import GroupResult
from rollbank.batching.config import AdvantageConfig
from rollbank.episodes.spans import SPANS_KEY
from rollbank.episodes.trajectory import Trajectory
from rollbank_bench.faults.kinds import EXPECT, FaultKind, Via


@dataclass
class Verdict:
    """One injected fault and what its attempt ended with."""

    kind: FaultKind
    attempt_id: str | None
    outcome: str | None  # None: the attempt never finished (cancelled at the run's end)
    reason: str | None
    detail: dict[str, Any] = field(default_factory=dict)
    #: why the outcome says nothing about this fault: another fault hit the attempt first
    #: (an engine killed with its request in flight, a port down) -- reported, not judged
    confounded: str | None = None
    #: the infra outcome's own evidence (error, server, turn), so a misattribution in a long
    #: run can be read afterwards (its run folder is gone by then)
    evidence: dict[str, str] = field(default_factory=dict)

    @property
    def observed(self) -> bool:
        return self.outcome is not None and self.confounded is None

    @property
    def correct(self) -> bool:
        return self.outcome in EXPECT[self.kind].outcomes

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "attempt_id": self.attempt_id, "outcome": self.outcome,
                "reason": self.reason, "expected": sorted(EXPECT[self.kind].outcomes),
                **({"confounded": self.confounded} if self.confounded else {}), **self.detail}


def verdict(kind: FaultKind, traj: Trajectory | None, **detail: Any) -> Verdict:
    o = traj.outcome if traj is not None else None
    keys: tuple[str, ...] = ("error", "server", "turn")
    evidence = ({k: str(o.evidence[k])[:300] for k in keys if k in o.evidence}
                if o is not None and o.outcome.value == "infra_failure" else {})
    return Verdict(kind, traj.trajectory_id if traj is not None else detail.pop("attempt_id", None),
                   o.outcome.value if o else None, o.reason.value if o else None, detail,
                   evidence=evidence)


def confounder(traj: Trajectory | None, collateral: set[str],
               down: Sequence[tuple[str, float, float]] = ()) -> str | None:
    """An engine-side collateral failure that ended the attempt before its own fault could
    show: its request was in flight on an engine the campaign killed (the proxy saw it), or
    its server's port was down (the client could not connect) when the failing request went
    out. ``down``: ``(server, start, end)`` port-down windows on the collector's clock; the
    failing request went out between the end of the attempt's last finished span and the end
    of its episode, so a window overlapping that on its server confounds it, whatever the
    client's error said (refused by the closed port, or reset in the closing listener's
    backlog before the proxy read it)."""
    o = traj.outcome if traj is not None else None
    if traj is None or o is None or o.reason.value != "inference_error":
        return None
    if traj.trajectory_id in collateral:
        return "request in flight on an engine killed for another attempt"
    if "cannot connect" in str(o.evidence.get("error", "")):
        return "server port down for another attempt"
    when = _failure_interval(traj)
    server = o.evidence.get("server")
    if when is not None and server is not None and any(
            url == server and start <= when[1] and when[0] <= end for url, start, end in down):
        return "server port down for another attempt"
    return None


def _failure_interval(traj: Trajectory) -> tuple[float, float] | None:
    """When an attempt's failing request can have gone out: after its last finished span,
    before its episode ended (None without an episode span)."""
    spans = traj.meta.get(SPANS_KEY, [])
    episode = [s for s in spans if s.get("kind") == "episode"]
    if not episode:
        return None
    lo = max((float(s["end"]) for s in spans if s.get("kind") != "episode"),
             default=float(episode[-1]["start"]))
    return lo, float(episode[-1]["end"])


def may_be_confounded(kind: FaultKind) -> bool:
    """Faults whose outcome another attempt's engine fault can pre-empt: all but the engine
    faults that must end the attempt anyway (a slow response must not: it is included)."""
    return EXPECT[kind].via is not Via.ENGINE or kind is FaultKind.SLOW_RESPONSE


def by_kind(verdicts: Iterable[Verdict]) -> dict[str, dict[str, Any]]:
    """Per kind: injected, observed (attempt finished), correctly attributed, reasons seen."""
    out: dict[str, dict[str, Any]] = {}
    groups: dict[FaultKind, list[Verdict]] = defaultdict(list)
    for v in verdicts:
        groups[v.kind].append(v)
    for kind in FaultKind:
        vs = groups.get(kind, [])
        seen = [v for v in vs if v.observed]
        out[kind.value] = {
            "injected": len(vs), "observed": len(seen),
            "confounded": sum(v.confounded is not None for v in vs),
            "correct": sum(v.correct for v in seen),
            "expected": sorted(EXPECT[kind].outcomes),
            "reasons": dict(Counter(f"{v.outcome}/{v.reason}" for v in seen)),
        }
    return out


def check_group(g: GroupResult, adv: AdvantageConfig, min_valid: int) -> list[str]:
    """What is wrong with one delivered group (empty: nothing)."""
    errs = []
    slots = [t.attempt for t in g.trajectories]
    if len(set(slots)) != len(slots):
        errs.append(f"{g.group_id}: a slot twice {slots}")
    if not all(is_valid(t) for t in g.trajectories):
        errs.append(f"{g.group_id}: a non-trainable sibling in the batch")
        return errs
    if len(g.trajectories) + g.infra_final != g.size:
        errs.append(f"{g.group_id}: {len(g.trajectories)} valid + {g.infra_final} infra != {g.size}")
    if len(g.trajectories) < min_valid:
        errs.append(f"{g.group_id}: {len(g.trajectories)} valid < min_valid {min_valid}")
    want = grpo_advantages([reward_of(t, adv) for t in g.trajectories], adv)
    if tuple(g.rewards) != want.rewards or not all(
            math.isclose(a, b, abs_tol=1e-9) for a, b in zip(g.advantages, want.advantages, strict=True)):
        errs.append(f"{g.group_id}: advantages not GRPO over the valid siblings")
    return errs


def check_ledger(ledger: dict[str, Any], trajectories: Sequence[Trajectory],
                 launched_events: int) -> list[str]:
    errs = []
    launched = int(ledger.get("launched", -1))
    settled = sum(int(ledger.get(s, 0)) for s in ("consumed", "retried", "waste"))
    open_ = sum(int(ledger.get(s, 0)) for s in ("in_flight", "finished", "delivered"))
    if launched != settled or open_:
        errs.append(f"ledger: launched {launched} != consumed+retried+waste {settled} (open {open_})")
    if launched != launched_events:
        errs.append(f"ledger: launched {launched} != {launched_events} launched events in the log")
    ids = Counter(t.trajectory_id for t in trajectories)
    dup = [a for a, n in ids.items() if n > 1]
    if dup:
        errs.append(f"attempts finished twice: {dup[:5]}")
    if len(ids) > launched:
        errs.append(f"{len(ids)} attempts finished > {launched} launched")
    return errs
