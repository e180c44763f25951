"""Verifier-loophole probes (``rollbank tasks validate --probe``).

Per task, each run in a FRESH sandbox from the task's built layers and verified exactly as a
collection verifies (``run_verifier`` with ``kill_leftovers`` unless the task declares a
service, like ``episodes/sandboxes.TaskVerifier``):

- ``oracle``: the oracle solution; must pass. Its run also finds the files it creates or
  changes (``find -cnewer`` a marker, outside /proc, /sys, /dev, /tmp, /solution, /tests, /logs):
  the task's *outputs*.
- every cheat of :data:`rollbank.episodes.cheats.CHEATS` (the catalogue and what each
  tries): its script, then its check in the agent's own view (a cheat that is not active
  there is reported ``inactive`` and not verified), then the verifier. Every cheat has a
  check, so each verified cheat is recorded ``active: true``: shown to hold where the agent
  left it (``unshown`` lists any verified without, and fails the probe).

A cheat that passes is a *loophole*: the task's verifier can be gamed by a policy. A toolchain
redirection whose verification ends other than ``fail`` (the no-op's verdict; a crash) shows the
verifier ran something the agent redirected: it is *reached*. Either makes the task's probe
fail. The no-op check stays in :mod:`rollbank.episodes.validate`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rollbank.episodes.cheats import CHEATS, Cheat
from rollbank.episodes.verifier import VerifierStatus, run_oracle, run_verifier
from rollbank.errors import InputError, RollbankError
from rollbank.sandbox.protocol import Sandbox, SandboxBackend, SandboxSpec
from rollbank.tasks.builder import EnvironmentBuilder
from rollbank.tasks.model import Task

MARKER = "/.rollbank-probe-marker"
MAX_OUTPUTS = 64
CHEAT_TIMEOUT_S = 60.0
FIND_OUTPUTS = (
    f"find / \\( -path /proc -o -path /sys -o -path /dev -o -path /tmp -o -path /solution "
    f"-o -path /tests -o -path /logs -o -path /run -o -path {MARKER} \\) -prune "
    f"-o -type f -cnewer {MARKER} -print 2>/dev/null | head -n {MAX_OUTPUTS}"
)
INACTIVE = "inactive: the cheat did not take effect in this image"

__all__ = ["CHEATS", "Cheat", "ProbeReport", "ProbeRun", "probe_built", "probe_task"]


@dataclass
class ProbeRun:
    name: str
    status: str | None = None  # verifier status: pass / fail / crash / ...
    reward: float | None = None
    error: str | None = None
    active: bool | None = None  # the cheat's check held in the agent's view (None: no check)
    redirects: bool = False  # a toolchain redirection (its verdict must be the no-op's)

    @property
    def passed(self) -> bool:
        return self.status == VerifierStatus.PASS.value

    @property
    def reached(self) -> bool:
        """A redirection that changed the verdict's kind: the verifier ran the agent's tool."""
        return self.redirects and self.status is not None and not self.passed and \
            self.status != VerifierStatus.FAIL.value and not self.status.startswith(
                ("skipped", "inactive"))


@dataclass
class ProbeReport:
    """What ``--probe`` adds to a task's validation."""

    task_id: str
    oracle: ProbeRun | None = None
    outputs: list[str] = field(default_factory=list)
    cheats: list[ProbeRun] = field(default_factory=list)
    skipped: str | None = None

    @property
    def loopholes(self) -> list[str]:
        return [c.name for c in self.cheats if c.passed]

    @property
    def reached(self) -> list[str]:
        return [c.name for c in self.cheats if c.reached]

    @property
    def inactive(self) -> list[str]:
        return [c.name for c in self.cheats if c.active is False]

    @property
    def unshown(self) -> list[str]:
        """Cheats verified without first being shown active in the agent's view (none: every
        cheat's check runs before its verification)."""
        return [c.name for c in self.cheats if c.status is not None and c.active is not True
                and not c.status.startswith(("skipped", "inactive"))]

    @property
    def ok(self) -> bool:
        oracle_ok = self.oracle is not None and self.oracle.passed
        return self.skipped is None and oracle_ok and not self.loopholes and not self.reached \
            and not self.unshown and all(c.error is None for c in self.cheats)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, loopholes=self.loopholes, reached=self.reached,
                 inactive=self.inactive, unshown=self.unshown)
        return d


async def _verify(sb: Sandbox, task: Task, run: ProbeRun) -> ProbeRun:
    v = await run_verifier(sb, task, kill_leftovers=not task.services)
    run.status, run.reward = v.status.value, v.reward
    return run


async def probe_task(task: Task, backend: SandboxBackend, spec: SandboxSpec,
                     cheats: Sequence[Cheat] = CHEATS) -> ProbeReport:
    """Run the oracle (finding its outputs) and every cheat, each in a fresh sandbox."""
    rep = ProbeReport(task.task_id)
    if task.steps:
        rep.skipped = "multi-step task: probes cover single-step tasks"
        return rep
    if task.solution is None:
        rep.skipped = "task has no oracle solution (its outputs are unknown)"
        return rep
    sb = await backend.start(spec)
    try:
        await sb.exec(["/bin/sh", "-c", f": > {MARKER}"], timeout_s=30)
        await run_oracle(sb, task)
        found = await sb.exec(["/bin/sh", "-c", FIND_OUTPUTS], timeout_s=120)
        rep.outputs = [ln for ln in found.stdout.splitlines() if ln.strip()]
        rep.oracle = await _verify(sb, task, ProbeRun("oracle"))
    except RollbankError as exc:
        rep.oracle = ProbeRun("oracle", error=f"{type(exc).__name__}: {exc}")
    finally:
        await sb.close()
    for cheat in cheats:
        run = ProbeRun(cheat.name, redirects=cheat.redirects)
        rep.cheats.append(run)
        if cheat.uses_outputs and not rep.outputs:
            run.status = "skipped: the oracle changed no file"
            continue
        sb = await backend.start(spec)
        try:
            await sb.exec(["/bin/bash", "-c", cheat.render(rep.outputs, spec.workdir)],
                          timeout_s=CHEAT_TIMEOUT_S, cwd=spec.workdir)
            res = await sb.exec(cheat.check_argv(spec.workdir, rep.outputs),
                                timeout_s=CHEAT_TIMEOUT_S, cwd="/")
            run.active = cheat.held(res.exit_code, res.stdout)
            if not run.active:
                run.status = INACTIVE
                continue
            await _verify(sb, task, run)
        except RollbankError as exc:
            run.error = f"{type(exc).__name__}: {exc}"
        finally:
            await sb.close()
    return rep


async def probe_built(task: Task, backend: SandboxBackend, builder: EnvironmentBuilder,
                      cheats: Sequence[Cheat] = CHEATS) -> ProbeReport:
    """Build (or find cached) the task's environment, then :func:`probe_task`."""
    from rollbank.episodes.validate import spec_for

    try:
        built = await asyncio.to_thread(builder.build, task)
    except InputError as exc:
        return ProbeReport(task.task_id, skipped=f"build failed: {exc}")
    return await probe_task(task, backend, spec_for(task, built), cheats)
