"""A group's scores under the current policy: the data the staleness gate judges.

:class:`GroupScores` is what a :class:`~rollbank.scheduling.drivers.scoring.PolicyScorer`
returns (the engine's prompt log-probs or the trainer's recompute) and what the pure gated
bank (:mod:`.gating`) takes back. Plain data: the scorers and their I/O live on the
driver side (:mod:`rollbank.scheduling.drivers.scoring`, ``rollbank.training.scorer``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupScores:
    """The current policy's log-probs of a group's trajectories.

    ``logprobs[trajectory_id]`` has one value per token of the trajectory (``out[0] = 0``;
    only model tokens are read); ``None`` = unmeasured. ``version`` is the weight version
    that scored them (the engine's, or the trainer's)."""

    version: int
    logprobs: Mapping[str, Sequence[float] | None]
    scorer: str
    seconds: float = 0.0  # wall time of the scoring call
    tokens: int = 0  # tokens scored (prompt + model, every sequence)
    errors: Mapping[str, str] = field(default_factory=dict)  # trajectory id -> why unmeasured
