"""The campaign's scripted policy — a BENCHMARK INSTRUMENT, not a model.

The accel-sim engine returns deterministic token ids, not commands, so the campaign takes the
model's *actions* from a script, through the runner's existing seam for that: a trace
workload (``episodes/workload.py``: the engine still generates every turn's tokens with
log-probs, the plan decides the action). :class:`ScriptedWorkload` is such a workload whose
plan, per attempt seed, is either a clean episode or one carrying the attempt's fault
(:class:`.kinds.FaultSchedule`):

- a model-caused fault is the model's command at its turn (memory hog, pids exhaustion, a
  sleep past the step timeout, ``rm -rf /``);
- a sandbox fault's turn writes the attempt seed to :data:`MARKER` and sleeps, so the
  injector (:mod:`.inject`) knows which sandbox to hit and hits it mid-command;
- engine faults need no special command (the proxy acts on the turn's request).

Clean episodes leave ``/app/done`` on even seeds, so groups have reward variance.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollbank.episodes.harnesses.base import Command
from rollbank.episodes.workload import EpisodePlan, TraceWorkload, TurnPlan, WorkloadConfig
from rollbank_bench.faults.kinds import EXPECT, FaultKind, FaultSchedule, Via
from rollbank_bench.faults.tasks import task_id_kind

MARKER = "/tmp/.rollbank-fault"
#: seconds a sandbox-fault turn's command runs (the fault lands 0.2-1.0 s into it)
SANDBOX_TURN_S = 3.0

MODEL_COMMANDS: dict[FaultKind, str] = {
    # 1000 MiB through tail (which buffers a line without newline) vs a 256 MiB limit
    FaultKind.MODEL_OOM: "head -c 1000m /dev/zero | tail > /dev/null",
    # more sleepers than the campaign's pids.max (sandbox.local.max_processes = 64)
    FaultKind.MODEL_PIDS: "for i in $(seq 100); do sleep 4 & done 2>/dev/null; true",
    FaultKind.MODEL_TIMEOUT: "sleep 60",
    FaultKind.MODEL_DESTROY: "rm -rf --no-preserve-root / 2>/dev/null; true",
}


@dataclass(frozen=True)
class ScriptedTurn(TurnPlan):
    """A turn whose command is given (the trace's turn sleeps ``tool_s`` instead)."""

    cmd: str = "true"

    def command(self) -> Command:
        return Command(self.cmd)


def sandbox_fault_command(seed: int) -> str:
    return f"echo {seed} > {MARKER}; sleep {SANDBOX_TURN_S}"


class ScriptedWorkload(TraceWorkload):
    """Plans per attempt seed from the fault schedule (pure)."""

    def __init__(self, schedule: FaultSchedule, tokens_per_turn: int = 8) -> None:
        super().__init__(WorkloadConfig(kind="trace"))
        self.schedule = schedule
        self.tokens = tokens_per_turn

    def plan(self, task_id: str, seed: int) -> EpisodePlan:
        if task_id_kind(task_id) is not None:  # the verifier is this attempt's fault
            self.schedule.exempt.add(seed)
        fault = self.schedule.planned(seed)
        cmds = ["echo step >> /app/log" for _ in range(self.schedule.turns)]
        if seed % 2 == 0:
            cmds[-1] += "; touch /app/done"
        if fault is not None:
            via = fault.kind
            if via in MODEL_COMMANDS:
                cmds[fault.turn] = MODEL_COMMANDS[via]
            elif EXPECT[via].via is Via.SANDBOX:
                cmds[fault.turn] = sandbox_fault_command(seed)
        return EpisodePlan(tuple(ScriptedTurn(self.tokens, 0.0, cmd=c) for c in cmds))

