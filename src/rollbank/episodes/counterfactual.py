"""Counterfactual attribution: on an error path, decide who caused a failure by experiment.

When the verifier times out, crashes or writes no reward, when the sandbox dies, or when a
step times out, :class:`Counterfactual` gathers an :class:`~rollbank.episodes.attribution.Experiment`
with what rollbank already has:

- a probe of the episode's sandbox: a trivial command (``ls /``) under a short deadline;
- the same check on a FRESH sandbox from the task's pristine state (the source's
  ``acquire``: a fork of the warm snapshot, or a cold start), under the task's own limits: the
  verifier re-run (verifier errors) or the probe (sandbox death, step timeout);
- the verifier baseline recorded by ``tasks validate`` (``episodes/validate.py``), if present;
- after a verified failure (:meth:`Counterfactual.after_fail`): the free space of the
  episode's writable layer (read only); only when it is full, a small write on a fresh
  pristine fork and, if that writes, the replay below with the fork's free space read after it;
- only when the episode's sandbox stopped answering (died, or hangs) while a pristine fork
  answers (``attribution.needs_replay``): a REPLAY of the episode's recorded model actions
  (:class:`ReplaySpec`) through the same :class:`~rollbank.episodes.tools.ToolExecutor` and
  per-step limits on a fresh fork, probed after every step (and re-verified when the failure
  surfaced during verification). It is bounded by the episode's budget (billed seconds) and
  by ``replay_cap_s`` wall seconds for the whole replay; a replay cut by the cap is
  inconclusive.

The decision itself is pure (``episodes/attribution.py``). The experiment runs only on those
error paths; a normal episode pays nothing. ``stats`` counts how often it ran and its cost.

Invariants
- Every sandbox the experiment starts is closed on every path; an experiment never raises
  for a sandbox/build failure (that is evidence: the pristine fork "fails the same way").
- The episode's sandbox is only probed, never modified.
- A probe is bounded in WALL time (``probe_timeout_s``): a frozen sandbox, whose commands are
  never billed, still cannot hold a probe; a probe the host stalled reads ``timed_out``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rollbank.clock import Clock, MonotonicClock
from rollbank.episodes.attribution import (
    DiskProbe,
    Experiment,
    LoopEnd,
    Probe,
    ProbeState,
    ReplayEvidence,
    ReplayState,
    VerifierVerdict,
    needs_replay,
)
from rollbank.episodes.harnesses import Command
from rollbank.episodes.sources import Acquired, SandboxSource, Verifier
from rollbank.episodes.tools import ToolExecutor, close_quietly
from rollbank.episodes.validate import VerifyBaseline, load_baseline
from rollbank.errors import RollbankError, SandboxError
from rollbank.sandbox.protocol import Sandbox
from rollbank.tasks.model import Task

#: ``ok`` if the sandbox runs a trivial command, plus ``stopped`` if any of its processes is
#: stopped (SIGSTOP: a stopped sandbox does not run; billing does not see it as a stall, so
#: a timeout there is an experiment's question, not the model's penalty). Without grep the
#: second part prints nothing.
PROBE_COMMAND = ("ls / >/dev/null && echo ok; "
                 "grep -qs '^State:[[:space:]]*T' /proc/[0-9]*/status && echo stopped; true")

#: Free space of the writable layer (``free <free blocks> <block size> <blocks>``), read only.
DISK_COMMAND = "stat -f -c 'free %f %S %b' /"
#: The same on a pristine fork, after trying to write a small file at ``/`` (``wrote``).
DISK_WRITE_COMMAND = ("head -c 4096 /dev/zero > /.rollbank-disk-probe && echo wrote; "
                      "rm -f /.rollbank-disk-probe; " + DISK_COMMAND)

BaselineOf = Callable[[str], VerifyBaseline | None]
#: Wall seconds a whole replay may take (``RunnerConfig.replay_cap_s`` sets it per collection).
REPLAY_CAP_S = 60.0


@dataclass(frozen=True)
class ReplaySpec:
    """What re-runs an episode's model actions: each step's recorded commands (index aligned
    with the trajectory's steps; empty for a malformed or final turn) and the episode's limits.
    ``then_verify``: the failure surfaced during verification, so the replayed fork is
    verified too."""

    steps: tuple[tuple[Command, ...], ...]
    step_timeout_s: float
    use_shell: bool = True
    workdir: str | None = None
    budget_s: float | None = None
    then_verify: bool = False
    then_disk: bool = False  # the replayed fork's free space is read after the replay


@dataclass
class CounterfactualStats:
    """How often the experiment ran and what it cost (seconds on the runner's clock)."""

    experiments: int = 0
    probes: int = 0
    pristine_probes: int = 0
    reverifies: int = 0
    cost_s: float = 0.0
    replays: int = 0
    disk_probes: int = 0


class Counterfactual:
    """Runs the experiments of one collection (or one replay); holds only counters."""

    def __init__(self, source: SandboxSource, verifier: Verifier, *, probe_timeout_s: float = 10.0,
                 baseline_of: BaselineOf | None = load_baseline, clock: Clock | None = None,
                 replay_cap_s: float = REPLAY_CAP_S) -> None:
        self.source = source
        self.replay_cap_s = replay_cap_s
        self.verifier = verifier
        self.probe_timeout_s = probe_timeout_s
        self.baseline_of = baseline_of
        self.clock: Clock = clock or MonotonicClock()
        self.stats = CounterfactualStats()

    # ------------------------------------------------------------ the two error paths
    async def after_step_timeout(self, sandbox: Sandbox, task: Task,
                                 replay: ReplaySpec | None = None) -> Experiment:
        """A step timed out: does the sandbox still answer? If not, does a pristine fork (and
        then a fork the model's actions were replayed on)?"""
        t0 = self.clock.now()
        episode = await self.probe(sandbox)
        if episode.answered:  # the usual case: a probe, no experiment
            return Experiment(episode=episode, cost_s=self.clock.now() - t0)
        self.stats.experiments += 1
        pristine = await self.probe_pristine(task)
        exp = Experiment(episode=episode, pristine=pristine)
        return await self._replay_if_needed(LoopEnd.STEP_TIMEOUT, exp, task, replay, t0)

    async def after_error(self, end: LoopEnd, verdict: VerifierVerdict | None, sandbox: Sandbox,
                          task: Task, replay: ReplaySpec | None = None) -> Experiment:
        """The sandbox died or the verifier failed: probe it, re-check on a pristine fork, and
        replay the model's actions on a fresh fork if that is still ambiguous."""
        t0 = self.clock.now()
        self.stats.experiments += 1
        episode = await self.probe(sandbox)
        if end is LoopEnd.SANDBOX_DIED or verdict is None:
            pristine = await self.probe_pristine(task)
            exp = Experiment(episode=episode, pristine=pristine)
            return await self._replay_if_needed(LoopEnd.SANDBOX_DIED, exp, task, replay, t0)
        pv, err = await self.reverify_pristine(task)
        baseline = await asyncio.to_thread(self.baseline_of, task.content_hash) \
            if self.baseline_of is not None else None
        exp = Experiment(episode=episode, pristine_verdict=pv, pristine_error=err,
                         verifier_timeout_s=task.verifier_timeout_s,
                         baseline_verify_s=baseline.noop_verify_s if baseline else None)
        return await self._replay_if_needed(end, exp, task, replay, t0)

    async def after_fail(self, sandbox: Sandbox, task: Task,
                         replay: ReplaySpec | None = None) -> Experiment | None:
        """A verified failure: is the episode's writable layer full? If not (the usual case:
        one read-only probe), None. If so, does a pristine fork write, and does replaying the
        model's actions fill a fresh fork's layer too?"""
        t0 = self.clock.now()
        episode = await self.disk(sandbox, write=False)
        if not episode.full:
            return None
        self.stats.experiments += 1
        pristine = await self.disk_pristine(task)
        exp = Experiment(episode_disk=episode, pristine_disk=pristine)
        if pristine.full is False:
            spec = replace(replay, then_verify=False, then_disk=True) if replay else None
            exp = replace(exp, replay=await self.replay(task, spec) if spec else ReplayEvidence(
                ReplayState.NOT_RUN, detail="the episode's actions were not given to the judge"))
        cost = self.clock.now() - t0
        self.stats.cost_s += cost
        return replace(exp, cost_s=cost)

    async def _replay_if_needed(self, end: LoopEnd, exp: Experiment, task: Task,
                                spec: ReplaySpec | None, t0: float) -> Experiment:
        if needs_replay(end, exp):
            ev = await self.replay(task, spec) if spec is not None else ReplayEvidence(
                ReplayState.NOT_RUN, detail="the episode's actions were not given to the judge")
            exp = replace(exp, replay=ev)
        cost = self.clock.now() - t0
        self.stats.cost_s += cost
        return replace(exp, cost_s=cost)

    # ------------------------------------------------------------ the experiments
    async def probe(self, sandbox: Sandbox) -> Probe:
        """A trivial command under a short deadline."""
        self.stats.probes += 1
        if not sandbox.alive:
            return Probe(ProbeState.DEAD, 0.0, "sandbox runtime is not running")
        t0 = self.clock.now()
        try:  # billed deadline (the command) and wall deadline (a frozen sandbox is not billed)
            r = await asyncio.wait_for(sandbox.exec(PROBE_COMMAND, timeout_s=self.probe_timeout_s),
                                       self.probe_timeout_s)
        except TimeoutError:
            return Probe(ProbeState.TIMED_OUT, self.clock.now() - t0,
                         f"no answer within {self.probe_timeout_s} wall seconds")
        except SandboxError as exc:
            return Probe(ProbeState.DEAD, self.clock.now() - t0, f"{type(exc).__name__}: {exc}")
        dt = self.clock.now() - t0
        if r.timed_out or r.host_stalled:
            return Probe(ProbeState.TIMED_OUT, dt, f"no answer within {self.probe_timeout_s} s"
                         + (" (the host stalled it)" if r.host_stalled else ""))
        if r.exit_code == 0 and "ok" in r.stdout.split():
            if "stopped" in r.stdout.split():  # found by `rollbank bench faults`
                return Probe(ProbeState.TIMED_OUT, dt, "processes of the sandbox are stopped "
                             "(SIGSTOP): it does not run")
            return Probe(ProbeState.OK, dt)
        return Probe(ProbeState.FAILED, dt,
                     f"exit {r.exit_code} signal {r.signal}: {(r.stderr or r.stdout)[-300:]}")

    async def disk(self, sandbox: Sandbox, *, write: bool) -> DiskProbe:
        """Free space of the sandbox's writable layer (and, ``write``, whether a small file
        can be written there); never raises."""
        self.stats.disk_probes += 1
        cmd = DISK_WRITE_COMMAND if write else DISK_COMMAND
        try:
            r = await asyncio.wait_for(sandbox.exec(cmd, timeout_s=self.probe_timeout_s),
                                       self.probe_timeout_s)
        except (TimeoutError, SandboxError) as exc:
            return DiskProbe(detail=f"{type(exc).__name__}: {exc}")
        return parse_disk(r.stdout, r.stderr, write=write)

    async def disk_pristine(self, task: Task) -> DiskProbe:
        """The write test on a fresh fork of the task's pristine state."""
        try:
            acq = await self.source.acquire(task, budget_s=None)
        except RollbankError as exc:
            return DiskProbe(detail=f"pristine fork: {type(exc).__name__}: {exc}")
        try:
            return await self.disk(acq.sandbox, write=True)
        finally:
            with contextlib.suppress(Exception):
                await acq.sandbox.close()

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
        except SandboxError as exc:
            return None, f"pristine sandbox failed during the re-verify: {exc}"
        finally:
            with contextlib.suppress(Exception):
                await acq.sandbox.close()
        dt = self.clock.now() - t0
        return VerifierVerdict(verdict.reward, dict(verdict.rewards), verdict.passed,
                               verdict.error, verdict.detail, verdict.duration_s or dt), None

    async def replay(self, task: Task, spec: ReplaySpec) -> ReplayEvidence:
        """Re-run the model's recorded actions on a fresh pristine fork, probing after each
        step; bounded by ``replay_cap_s`` wall seconds. Never raises for a sandbox failure."""
        self.stats.replays += 1
        t0 = self.clock.now()
        total = sum(1 for s in spec.steps if s)
        try:
            acq = await self.source.acquire(task, budget_s=None)
        except RollbankError as exc:
            return ReplayEvidence(ReplayState.NOT_RUN, steps_total=total, cap_s=self.replay_cap_s,
                                  detail=f"pristine fork: {type(exc).__name__}: {exc}")
        done: list[dict[str, Any]] = []
        executor = ToolExecutor(acq.sandbox, step_timeout_s=spec.step_timeout_s,
                                use_shell=spec.use_shell, workdir=spec.workdir or acq.workdir,
                                budget_s=spec.budget_s)
        try:
            async with asyncio.timeout(self.replay_cap_s):
                ev = await self._replay_on(acq, executor, task, spec, done)
                if spec.then_disk and ev.state is ReplayState.HEALTHY:
                    ev = replace(ev, fork_disk=await self.disk(acq.sandbox, write=False))
        except TimeoutError:
            ev = ReplayEvidence(ReplayState.INCONCLUSIVE,
                                detail=f"cut by the replay cap ({self.replay_cap_s} s)")
        finally:
            await close_quietly(executor, acq.sandbox)
        return replace(ev, steps_total=total, steps=tuple(done), cap_s=self.replay_cap_s,
                       duration_s=self.clock.now() - t0)

    async def _replay_on(self, acq: Acquired, executor: ToolExecutor, task: Task,
                         spec: ReplaySpec, done: list[dict[str, Any]]) -> ReplayEvidence:
        fork = acq.sandbox
        mem = pids = False
        for i, commands in enumerate(spec.steps):
            if not commands:
                continue
            text = "\n".join(c.text for c in commands)
            t0 = self.clock.now()
            try:
                results = await executor.run(commands)
            except SandboxError as exc:
                done.append({"index": i, "wall_s": round(self.clock.now() - t0, 3),
                             "error": f"{type(exc).__name__}: {exc}"[:300]})
                return ReplayEvidence(ReplayState.REPRODUCED, i, text, Probe(
                    ProbeState.DEAD, 0.0, f"{type(exc).__name__}: {exc}"),
                    memory_limit_hit=mem, pids_limit_hit=pids)
            mem = mem or any(r.oom_killed for r in results)
            pids = pids or any(r.pids_limit_hit for r in results)
            last = results[-1] if results else None
            probe = await self.probe(fork)
            done.append({"index": i, "wall_s": round(self.clock.now() - t0, 3),
                         "billed_s": round(sum(r.billed_s for r in results), 3),
                         "exit_code": last.exit_code if last else None,
                         "timed_out": any(r.timed_out for r in results),
                         "probe": probe.state.value})
            if any(r.host_stalled for r in results):
                return ReplayEvidence(ReplayState.INCONCLUSIVE, detail=(
                    f"the host stalled replayed step {i} beyond max_host_stall_s"))
            if probe.state is not ProbeState.OK:
                return ReplayEvidence(ReplayState.REPRODUCED, i, text, probe,
                                      memory_limit_hit=mem, pids_limit_hit=pids)
            if any(r.budget_exhausted for r in results):
                break  # the episode's budget is spent: nothing more ran in the episode either
        if not spec.then_verify:
            return ReplayEvidence(ReplayState.HEALTHY, fork_probe=Probe(ProbeState.OK),
                                  memory_limit_hit=mem, pids_limit_hit=pids)
        await executor.close()  # as the runner does before verifying
        try:
            await self.verifier.verify(fork, task)
        except SandboxError as exc:
            return ReplayEvidence(ReplayState.REPRODUCED, "verify", None, Probe(
                ProbeState.DEAD, 0.0, f"{type(exc).__name__}: {exc}"), verified=True,
                memory_limit_hit=mem, pids_limit_hit=pids)
        # the verifier's own verdict is not the question here; the fork's health is
        probe = await self.probe(fork)
        state = ReplayState.HEALTHY if probe.state is ProbeState.OK else ReplayState.REPRODUCED
        return ReplayEvidence(state, "verify" if state is ReplayState.REPRODUCED else None, None,
                              probe, verified=True, memory_limit_hit=mem, pids_limit_hit=pids)


def parse_disk(stdout: str, stderr: str, *, write: bool) -> DiskProbe:
    """What :data:`DISK_COMMAND` (or :data:`DISK_WRITE_COMMAND`) printed."""
    words = stdout.split()
    wrote = ("wrote" in words) if write else None
    for line in stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[0] == "free" and all(x.isdigit() for x in f[1:]):
            free, bsize, blocks = (int(x) for x in f[1:])
            return DiskProbe(free * bsize, blocks * bsize, wrote, stderr.strip()[-200:])
    return DiskProbe(None, None, wrote, (stderr or stdout).strip()[-200:] or "no free-space line")
