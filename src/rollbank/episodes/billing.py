"""What one step's commands billed the model, for the runner's loop end and its evidence.

The sandbox bills each command (``ExecResult.billed_s`` = wall time minus measured host
stall, see :mod:`rollbank.sandbox.billing`); its step timeout and the episode budget are
enforced in billed seconds, so a ``timed_out`` / ``budget_exhausted`` command is the model's
own time by construction. This module only sums a step and names the one case the host
caused: a command stopped because the host stalled it beyond the cap (``host_stalled``),
which ends the episode as infra (``host_error``), never as the model's timeout. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollbank.sandbox.protocol import ExecResult


@dataclass(frozen=True)
class StepBill:
    wall_s: float
    billed_s: float
    stall_s: float
    host_stalled: bool

    def evidence(self) -> dict[str, Any]:
        """Fields for the loop end's evidence (only when the host stalled something)."""
        if not self.stall_s and not self.host_stalled:
            return {}
        return {"billed_s": round(self.billed_s, 3), "host_stall_s": round(self.stall_s, 3),
                "host_stalled": self.host_stalled}


def step_bill(results: Sequence[ExecResult]) -> StepBill:
    return StepBill(
        wall_s=sum(r.duration_s for r in results),
        billed_s=sum(r.billed_s for r in results),
        stall_s=sum(r.stall_s for r in results),
        host_stalled=any(r.host_stalled for r in results),
    )
