"""Timed spans of one episode: when it held a sandbox, used a server, ran a tool, verified.

The runner appends a :class:`Span` for every phase of an episode and stores them, as plain
dicts, in ``Trajectory.meta["spans"]``. Metrics (busy/idle time, the lower bound, timelines)
read them back with :func:`spans_of`. Times are seconds on the collector's clock.

Invariants
- ``start <= end`` for every span.
- Inference spans carry the server that answered and its token counts; exec spans carry the
  sandbox id; both carry the trajectory id so a timeline can be drawn per server or sandbox.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from rollbank.episodes.trajectory import Trajectory

SpanKind = Literal["sandbox_setup", "inference", "exec", "verify", "episode"]

SPANS_KEY = "spans"


@dataclass(frozen=True)
class Span:
    kind: SpanKind
    start: float
    end: float
    trajectory_id: str
    server: str | None = None
    sandbox: str | None = None
    prompt_tokens: int = 0  # prompt tokens sent (inference)
    cached_tokens: int | None = None  # prefix-cache hit reported by the server (inference)
    gen_tokens: int = 0  # tokens generated (inference)

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"span {self.kind} ends before it starts ({self.start} > {self.end})")

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens the server had to prefill (all of them when it reports no cache hit)."""
        return self.prompt_tokens - (self.cached_tokens or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Span:
        return cls(**d)


def add_span(traj: Trajectory, span: Span) -> None:
    traj.meta.setdefault(SPANS_KEY, []).append(span.to_dict())


def spans_of(traj: Trajectory, kind: SpanKind | None = None) -> list[Span]:
    raw: list[dict[str, Any]] = traj.meta.get(SPANS_KEY, [])
    spans = [Span.from_dict(d) for d in raw]
    return [s for s in spans if kind is None or s.kind == kind]
