"""Verify a finished episode inside its sandbox, and run a task's oracle solution.

Owns: the verifier protocol shared by Harbor and Terminal-Bench 1 tasks and its mapping to
:class:`~rollbank.episodes.outcome.EpisodeOutcome`.

Sequence (:func:`run_verifier`, called only after the agent finished)
1. remove ``/tests``, ``/logs/verifier`` and the shim directory and recreate them empty
   (``/logs`` if it is a symlink is replaced). Unpinned only: ``kill_leftovers=True`` SIGKILLs every
   process the agent left (a background loop could otherwise rewrite the reward file or the
   tests): by cgroup when the sandbox can (``PinnedExec.kill_leftovers``: a process that
   keeps forking copies of itself cannot slip through), then every pid of the sandbox but
   pid 1, the backend's ``sleep infinity`` anchor and the reset shell. The collection's verifier
   (``episodes/sandboxes.TaskVerifier``) passes it for every task that does not declare a
   service (``Task.services``): tasks about services on loopback need them alive;
2. write the task's tests (and e.g. TB1's run-tests.sh) into the fresh ``/tests`` through the
   Sandbox API — the agent never saw them and cannot alter them — and the offline shims
   (:mod:`rollbank.tasks.shims`);
3. run ``task.test_command`` with the shims first on PATH, the task's verifier env, and the
   verifier's own timeout (``task.verifier_timeout_s``);
4. read ``/logs/verifier/reward.txt`` (one number) or else ``reward.json`` (named numbers;
   the scalar is their mean).

When the sandbox can pin (:class:`~rollbank.sandbox.protocol.PinnedExec`), steps 1-4 run
as one command on the task's *pristine toolchain* instead (:mod:`.verifier_pinned`):
:data:`TOOLCHAIN_PINS` show the task's built layers, not what the agent made of them, files
the agent added at ``/`` are hidden, and ``/tests``, ``/logs/verifier`` and the shims are
private to the command (a trojan ``pytest``, a ``/pytest.ini`` + ``/conftest.py`` rootdir
hijack, an ``/etc/ld.so.preload``, a service rewriting the reward do not reach it); user
site-packages are off (``PYTHONNOUSERSITE=1``; a task's verifier env may override it). See
docs/collect.md, "Verifier isolation".

What both ways share (the paths, :class:`VerifierResult`, :func:`classify`) is in
:mod:`.verifier_result`.

Classification: timeout -> ``verifier_timeout``; a reward that cannot be parsed, or no reward
and a non-zero exit / signal (e.g. a missing interpreter, exit 126/127), or a shim's record of a
dependency it could not install offline -> ``verifier_crash``;
exit 0 but no reward -> ``verifier_no_reward``; otherwise ``verified_pass`` when the reward is 1
(every reward.json entry 1) and ``verified_fail`` below that.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
from pathlib import Path
from typing import Any

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.verifier_pinned import run_pinned
from rollbank.episodes.verifier_result import (
    KILL_LEFTOVERS,
    OUTPUT_LIMIT,
    PASS_EPS,
    REWARD_JSON,
    REWARD_TXT,
    SHIM_ERROR,
    TOOLCHAIN_PINS,
    VERIFIER_ENV,
    VerifierResult,
    VerifierStatus,
    classify,
    parse_reward_json,
    parse_reward_txt,
    shim_crash,
    test_files,
)
from rollbank.sandbox.protocol import ExecResult, PinnedExec, Sandbox
from rollbank.tasks.model import Task, TaskFormat
from rollbank.tasks.shims import SHIM_DIR, shim_files

__all__ = ["KILL_LEFTOVERS", "OUTPUT_LIMIT", "PASS_EPS", "REWARD_JSON", "REWARD_TXT", "SHIM_ERROR",
           "TOOLCHAIN_PINS", "VERIFIER_ENV", "VerifierResult", "VerifierStatus", "classify",
           "parse_reward_json", "parse_reward_txt", "prepare", "run_oracle", "run_verifier",
           "shim_crash", "test_files", "verifier_outcome"]



_REASON = {
    VerifierStatus.PASS: Reason.VERIFIED_PASS,
    VerifierStatus.FAIL: Reason.VERIFIED_FAIL,
    VerifierStatus.CRASH: Reason.VERIFIER_CRASH,
    VerifierStatus.TIMEOUT: Reason.VERIFIER_TIMEOUT,
    VerifierStatus.NO_REWARD: Reason.VERIFIER_NO_REWARD,
    VerifierStatus.HOST_STALLED: Reason.HOST_STALLED,
}


def verifier_outcome(result: VerifierResult) -> EpisodeOutcome:
    """Map a verifier result to the episode's verdict (infra reasons for verifier faults)."""
    evidence: dict[str, Any] = {"verifier_exit_code": result.exit_code,
                                "verifier_signal": result.signal,
                                "verifier_duration_s": round(result.duration_s, 3),
                                "verifier_pinned": result.pinned}
    if result.error:
        evidence["verifier_error"] = result.error
    if result.status in (VerifierStatus.CRASH, VerifierStatus.TIMEOUT, VerifierStatus.NO_REWARD):
        evidence["verifier_stderr_tail"] = result.stderr_tail[-2000:]
        evidence["verifier_stdout_tail"] = result.stdout_tail[-2000:]
    return EpisodeOutcome.of(_REASON[result.status], reward=result.reward,
                             rewards=result.rewards, **evidence)


def _stage(root: Path, files: list[tuple[str, bytes, int]]) -> None:
    root.chmod(0o755)
    for rel, data, mode in files:
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        for parent in dst.relative_to(root).parents:
            (root / parent).chmod(0o755)
        dst.write_bytes(data)
        dst.chmod(mode)


async def _write_tree(sandbox: Sandbox, files: list[tuple[str, Path]], dest: str) -> None:
    """Copy host files (symlinks followed) to ``dest`` in one upload."""
    await _upload(sandbox, [(rel, path.read_bytes(), 0o755 if path.stat().st_mode & 0o111 else 0o644)
                            for rel, path in files], dest)


async def _upload(sandbox: Sandbox, files: list[tuple[str, bytes, int]], dest: str) -> None:
    if not files:
        return
    with tempfile.TemporaryDirectory(prefix="rollbank-verifier-") as tmp:
        await asyncio.to_thread(_stage, Path(tmp), files)
        await sandbox.upload(Path(tmp), dest)


async def _read_optional(sandbox: Sandbox, path: str) -> str | None:
    check = await sandbox.exec(["test", "-f", path], timeout_s=30)
    if check.exit_code != 0:
        return None
    data = await sandbox.read_file(path, limit=64 * 1024)
    return data.decode("utf-8", "replace")


async def prepare(sandbox: Sandbox, task: Task, *, kill_leftovers: bool = False) -> ExecResult:
    """Steps 1-2: clear the stage and write tests and shims (agent must have finished)."""
    reset = ((KILL_LEFTOVERS if kill_leftovers else "")
             + f"rm -rf /tests {SHIM_DIR}; [ -L /logs ] && rm -f /logs; rm -rf /logs/verifier; "
             f"mkdir -p /tests /logs/verifier /logs/agent {SHIM_DIR}")
    res = await sandbox.exec(["/bin/sh", "-c", reset], timeout_s=60)
    if res.exit_code != 0:
        return res
    await _write_tree(sandbox, test_files(task.tests_dir) + list(task.extra_test_files), "/tests")
    await _upload(sandbox, [(name, data, mode) for name, (data, mode) in shim_files().items()],
                  SHIM_DIR)
    return res


async def run_verifier(sandbox: Sandbox, task: Task, *, timeout_s: float | None = None,
                       kill_leftovers: bool = False) -> VerifierResult:
    """Run the task's verifier in ``sandbox`` (after the agent finished) and classify it."""
    pinned = _pinnable(sandbox)
    if pinned is not None:  # on the pristine toolchain, in one command; the agent's processes
        # keep running as under Harbor: they cannot reach its view (see verifier_pinned)
        return await run_pinned(pinned, task, timeout_s=timeout_s or task.verifier_timeout_s,
                                kill_leftovers=False)
    prep = await prepare(sandbox, task, kill_leftovers=kill_leftovers)
    if prep.host_stalled:
        return classify(prep, None, None)
    if prep.exit_code != 0:
        return VerifierResult(VerifierStatus.CRASH, None, exit_code=prep.exit_code,
                              signal=prep.signal, stderr_tail=prep.stderr[-4000:],
                              error="could not prepare /tests and /logs/verifier")
    command = (f'export PATH={SHIM_DIR}:"$PATH"; export HOME="${{HOME:-/root}}"; '
               f"{task.test_command}")
    res = await sandbox.exec(["/bin/bash", "-c", command],
                             env={**VERIFIER_ENV, **task.verifier_env},
                             timeout_s=timeout_s or task.verifier_timeout_s,
                             output_limit=OUTPUT_LIMIT)
    if res.timed_out or res.budget_exhausted or res.host_stalled:
        return classify(res, None, None)
    shim_error = await _read_optional(sandbox, SHIM_ERROR)
    if shim_error is not None:
        return shim_crash(res, shim_error)
    txt = await _read_optional(sandbox, REWARD_TXT)
    js = None if txt is not None else await _read_optional(sandbox, REWARD_JSON)
    return classify(res, txt, js)


def _pinnable(sandbox: Sandbox) -> PinnedExec | None:
    return sandbox if isinstance(sandbox, PinnedExec) and sandbox.can_pin else None


async def run_oracle(sandbox: Sandbox, task: Task, *, timeout_s: float | None = None) -> ExecResult | None:
    """Upload and run the task's oracle solution (as the agent would); None if it has none."""
    if task.solution is None:
        return None
    if task.format is TaskFormat.HARBOR:
        files = test_files(task.solution.parent)
    else:
        files = [("solve.sh", task.solution)]
    await sandbox.exec(["/bin/sh", "-c", "rm -rf /solution && mkdir -p /solution"], timeout_s=60)
    await _write_tree(sandbox, files, "/solution")
    script = "/solution/" + (task.solution.name if task.format is TaskFormat.HARBOR else "solve.sh")
    return await sandbox.exec(["/bin/bash", "-c", f"bash {shlex.quote(script)}"],
                              env=dict(task.solution_env),
                              timeout_s=timeout_s or task.agent_timeout_s,
                              output_limit=OUTPUT_LIMIT)
