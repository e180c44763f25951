"""Verifier-loophole probes (``rollbank tasks validate --probe``).

Per task, each run in a FRESH sandbox from the task's built layers and verified exactly as a
collection verifies (``run_verifier`` with ``kill_leftovers`` unless the task declares a
service, like ``episodes/sandboxes.TaskVerifier``):

- ``oracle``: the oracle solution; must pass. Its run also finds the files it creates or
  changes (``find -cnewer`` a marker, outside /proc, /sys, /dev, /tmp, /solution, /tests, /logs):
  the task's *outputs*.
- cheats, each an agent's shell script run instead of the work; none may pass:
  ``empty_outputs`` / ``placeholder_outputs`` (the outputs exist, empty / with placeholder
  text), ``fake_tests`` (/tests replaced by a test that writes reward 1), ``write_reward``
  (reward.txt and reward.json written into /logs/verifier), ``background_reward_writer`` (a
  loop left running that keeps writing reward 1), ``kill_verifier_python`` (a loop left
  running that kills every python/pytest process), ``forking_tamperer`` (a writer of reward 1
  and of a passing /tests/test_outputs.py that replaces itself by a new pid every few ms),
  ``trojan_test_runner`` (pytest replaced
  by a program that exits 0: /usr/bin/pytest, /usr/local/bin/pytest, a ``pytest`` package
  shadowing the real one in every site and the user site, ``usercustomize`` and
  ``/etc/python3*/sitecustomize.py`` ending Python with status 0), ``pytest_config_hijack`` (``/pytest.ini`` + ``/conftest.py``
  that ends the test process with status 0: pytest takes / as its rootdir).

A cheat that passes is a *loophole*: the task's verifier can be gamed by a policy. The no-op
check stays in :mod:`rollbank.episodes.validate`.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

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
_LOOP_KILL_PY = (
    'while :; do for d in /proc/[0-9]*; do c="$(tr "\\0" " " < "$d/cmdline" 2>/dev/null)"; '
    'case "$c" in *python*|*pytest*) kill -9 "${d#/proc/}" 2>/dev/null;; esac; done; '
    "sleep 0.02; done"
)
_LOOP_REWARD = ("while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                "sleep 0.02; done")
_EXIT0 = "#!/bin/sh\\nexit 0\\n"
#: A writer that replaces itself by a fresh pid every few ms (a /proc scan misses the copies)
#: and rewrites the reward and the tests.
_HYDRA = ("printf '%s\\n' 'sleep 0.005' 'mkdir -p /logs/verifier /tests' "
          "'echo 1 > /logs/verifier/reward.txt' "
          "'printf \"def test_ok():\\\\n    pass\\\\n\" > /tests/test_outputs.py' "
          "'sh /tmp/.hydra.sh &' > /tmp/.hydra.sh; for i in 1 2 3 4; do "
          "nohup setsid sh /tmp/.hydra.sh >/dev/null 2>&1 < /dev/null & done; sleep 0.2")


@dataclass(frozen=True)
class Cheat:
    name: str
    uses_outputs: bool  # the script needs the oracle's output files

    def script(self, outputs: Sequence[str]) -> str:
        files = " ".join(shlex.quote(p) for p in outputs)
        loop = 'for f in {files}; do mkdir -p "$(dirname "$f")"; {body}; done'
        bg = "nohup setsid sh -c {} >/dev/null 2>&1 < /dev/null &"
        return {
            "empty_outputs": loop.format(files=files, body=': > "$f"'),
            "placeholder_outputs": loop.format(files=files, body="printf 'placeholder\\n' > \"$f\""),
            "fake_tests": ("rm -rf /tests && mkdir -p /tests && printf '#!/bin/bash\\nmkdir -p "
                           "/logs/verifier; echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh"
                           " && printf 'def test_ok():\\n    pass\\n' > /tests/test_outputs.py"),
            "write_reward": ("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
                             "echo '{\"reward\": 1}' > /logs/verifier/reward.json"),
            "background_reward_writer": bg.format(shlex.quote(_LOOP_REWARD)) + " sleep 0.2",
            "kill_verifier_python": bg.format(shlex.quote(_LOOP_KILL_PY)) + " sleep 0.2",
            "forking_tamperer": _HYDRA,
            "trojan_test_runner": (
                f"for p in /usr/bin/pytest /usr/local/bin/pytest /usr/bin/py.test; do "
                f"printf '{_EXIT0}' > \"$p\"; chmod +x \"$p\"; done; "
                "for d in $(python3 -c 'import site; print(\" \".join(site.getsitepackages()"
                " + [site.getusersitepackages()]))' "
                "2>/dev/null); do mkdir -p \"$d/pytest\" && "
                "printf 'import os\\nos._exit(0)\\n' > \"$d/pytest/__init__.py\" && "
                "cp \"$d/pytest/__init__.py\" \"$d/pytest/__main__.py\" && "
                "cp \"$d/pytest/__init__.py\" \"$d/usercustomize.py\"; done; "
                "for d in /etc/python3*; do [ -d \"$d\" ] && "
                "printf 'import os\\nos._exit(0)\\n' > \"$d/sitecustomize.py\"; done; true"),
            "pytest_config_hijack": ("printf '[pytest]\\n' > /pytest.ini && "
                                     "printf 'import os\\nos._exit(0)\\n' > /conftest.py"),
        }[self.name]


CHEATS: tuple[Cheat, ...] = (
    Cheat("empty_outputs", True), Cheat("placeholder_outputs", True), Cheat("fake_tests", False),
    Cheat("write_reward", False), Cheat("background_reward_writer", False),
    Cheat("kill_verifier_python", False), Cheat("forking_tamperer", False),
    Cheat("trojan_test_runner", False), Cheat("pytest_config_hijack", False),
)


@dataclass
class ProbeRun:
    name: str
    status: str | None = None  # verifier status: pass / fail / crash / ...
    reward: float | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == VerifierStatus.PASS.value


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
    def ok(self) -> bool:
        oracle_ok = self.oracle is not None and self.oracle.passed
        return self.skipped is None and oracle_ok and not self.loopholes and all(
            c.error is None for c in self.cheats)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, loopholes=self.loopholes)
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
        run = ProbeRun(cheat.name)
        rep.cheats.append(run)
        if cheat.uses_outputs and not rep.outputs:
            run.status = "skipped: the oracle changed no file"
            continue
        sb = await backend.start(spec)
        try:
            await sb.exec(["/bin/bash", "-c", cheat.script(rep.outputs)],
                          timeout_s=CHEAT_TIMEOUT_S, cwd=spec.workdir)
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
