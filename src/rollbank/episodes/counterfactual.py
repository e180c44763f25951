"""Counterfactual attribution: on an error path, decide who caused a failure by experiment.

When the verifier times out, crashes or writes no reward, when the sandbox dies, or when a
step times out, :class:`Counterfactual` gathers an :class:`~rollbank.episodes.attribution.Experiment`
with what rollbank already has:

- a probe of the episode's sandbox: a trivial command (``ls /``) under a short deadline;
- the same check on a FRESH sandbox from the task's pristine state (the source's
  ``acquire``: a fork of the warm snapshot, or a cold start), under the task's own limits: the
  verifier re-run (verifier errors) or the probe (sandbox death, step timeout);
- the verifier baseline recorded by ``tasks validate`` (``episodes/validate.py``), if present.

The decision itself is pure (``episodes/attribution.py``). The experiment runs only on those
error paths; a normal episode pays nothing. ``stats`` counts how often it ran and its cost.

Invariants
- Every sandbox the experiment starts is closed on every path; an experiment never raises
  for a sandbox/build failure (that is evidence: the pristine fork "fails the same way").
- The episode's sandbox is only probed, never modified.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from rollbank.clock import Clock, MonotonicClock
from rollbank.episodes.attribution import (
    Experiment,
    LoopEnd,
    Probe,
    ProbeState,
    VerifierVerdict,
)
from rollbank.episodes.outcome import Reason
from rollbank.episodes.sources import SandboxSource, Verifier
from rollbank.episodes.validate import VerifyBaseline, load_baseline
from rollbank.errors import RollbankError, SandboxError, VerifierError, VerifierTimeoutError
from rollbank.sandbox.protocol import Sandbox
from rollbank.tasks.model import Task

PROBE_COMMAND = "ls / >/dev/null && echo ok"

BaselineOf = Callable[[str], VerifyBaseline | None]


@dataclass
class CounterfactualStats:
    """How often the experiment ran and what it cost (seconds on the runner's clock)."""

    experiments: int = 0
    probes: int = 0
    pristine_probes: int = 0
    reverifies: int = 0
    cost_s: float = 0.0


class Counterfactual:
    """Runs the experiments of one collection (or one replay); holds only counters."""

    def __init__(self, source: SandboxSource, verifier: Verifier, *, probe_timeout_s: float = 10.0,
                 baseline_of: BaselineOf | None = load_baseline, clock: Clock | None = None) -> None:
        self.source = source
        self.verifier = verifier
        self.probe_timeout_s = probe_timeout_s
        self.baseline_of = baseline_of
        self.clock: Clock = clock or MonotonicClock()
        self.stats = CounterfactualStats()

    # ------------------------------------------------------------ the two error paths
    async def after_step_timeout(self, sandbox: Sandbox, task: Task) -> Experiment:
        """A step timed out: does the sandbox still answer? If not, does a pristine fork?"""
        t0 = self.clock.now()
        episode = await self.probe(sandbox)
        if episode.answered:  # the usual case: a probe, no experiment
            return Experiment(episode=episode, cost_s=self.clock.now() - t0)
        self.stats.experiments += 1
        pristine = await self.probe_pristine(task)
        return self._done(Experiment(episode=episode, pristine=pristine), t0)

    async def after_error(self, end: LoopEnd, verdict: VerifierVerdict | None, sandbox: Sandbox,
                          task: Task) -> Experiment:
        """The sandbox died or the verifier failed: probe it, and re-check on a pristine fork."""
        t0 = self.clock.now()
        self.stats.experiments += 1
        episode = await self.probe(sandbox)
        if end is LoopEnd.SANDBOX_DIED or verdict is None:
            pristine = await self.probe_pristine(task)
            return self._done(Experiment(episode=episode, pristine=pristine), t0)
        pv, err = await self.reverify_pristine(task)
        baseline = await asyncio.to_thread(self.baseline_of, task.content_hash) \
            if self.baseline_of is not None else None
        return self._done(Experiment(
            episode=episode, pristine_verdict=pv, pristine_error=err,
            verifier_timeout_s=task.verifier_timeout_s,
            baseline_verify_s=baseline.noop_verify_s if baseline else None), t0)

    def _done(self, exp: Experiment, t0: float) -> Experiment:
        cost = self.clock.now() - t0
        self.stats.cost_s += cost
        return Experiment(exp.episode, exp.pristine, exp.pristine_verdict, exp.pristine_error,
                          exp.verifier_timeout_s, exp.baseline_verify_s, cost)

    # ------------------------------------------------------------ the experiments
    async def probe(self, sandbox: Sandbox) -> Probe:
        """A trivial command under a short deadline."""
        self.stats.probes += 1
        if not sandbox.alive:
            return Probe(ProbeState.DEAD, 0.0, "sandbox runtime is not running")
        t0 = self.clock.now()
        try:
            r = await sandbox.exec(PROBE_COMMAND, timeout_s=self.probe_timeout_s)
        except SandboxError as exc:
            return Probe(ProbeState.DEAD, self.clock.now() - t0, f"{type(exc).__name__}: {exc}")
        dt = self.clock.now() - t0
        if r.timed_out:
            return Probe(ProbeState.TIMED_OUT, dt, f"no answer within {self.probe_timeout_s} s")
        if r.exit_code == 0 and "ok" in r.stdout:
            return Probe(ProbeState.OK, dt)
        return Probe(ProbeState.FAILED, dt,
                     f"exit {r.exit_code} signal {r.signal}: {(r.stderr or r.stdout)[-300:]}")

    async def probe_pristine(self, task: Task) -> Probe:
        """The probe on a fresh fork of the task's pristine state (DEAD if none can start)."""
        self.stats.pristine_probes += 1
        try:
            acq = await self.source.acquire(task, budget_s=None)
        except RollbankError as exc:
            return Probe(ProbeState.DEAD, 0.0, f"pristine fork: {type(exc).__name__}: {exc}")
        try:
            return await self.probe(acq.sandbox)
        finally:
            with contextlib.suppress(Exception):
                await acq.sandbox.close()

    async def reverify_pristine(self, task: Task) -> tuple[VerifierVerdict | None, str | None]:
        """The task's verifier on a fresh fork of the pristine state, under the same limits."""
        self.stats.reverifies += 1
        try:
            acq = await self.source.acquire(task, budget_s=None)
        except RollbankError as exc:
            return None, f"pristine fork: {type(exc).__name__}: {exc}"
        t0 = self.clock.now()
        try:
            verdict = await self.verifier.verify(acq.sandbox, task)
        except VerifierTimeoutError as exc:
            verdict = VerifierVerdict(None, error=Reason.VERIFIER_TIMEOUT, detail=str(exc))
        except VerifierError as exc:
            verdict = VerifierVerdict(None, error=Reason.VERIFIER_CRASH, detail=str(exc))
        except SandboxError as exc:
            return None, f"pristine sandbox failed during the re-verify: {exc}"
        finally:
            with contextlib.suppress(Exception):
                await acq.sandbox.close()
        dt = self.clock.now() - t0
        return VerifierVerdict(verdict.reward, dict(verdict.rewards), verdict.passed,
                               verdict.error, verdict.detail, verdict.duration_s or dt), None
