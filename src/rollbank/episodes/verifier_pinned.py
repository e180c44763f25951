"""The verifier on the task's pristine toolchain, in one pinned command.

Owns :func:`run_pinned`, used by :func:`rollbank.episodes.verifier.run_verifier` when the
sandbox can pin (:class:`~rollbank.sandbox.protocol.PinnedExec`). One command, in a private
mount namespace (``rb-helper vexec``) where:

- :data:`~rollbank.episodes.verifier.TOOLCHAIN_PINS` show the task's pristine layers and
  files the agent added at ``/`` are hidden (the toolchain the verifier runs with);
- ``/tests``, ``/logs/verifier``, the shim directory and the command's output directory are
  fresh directories that only this command sees (:data:`PRIVATE`): a process the agent left
  running (a task's service) cannot rewrite the tests, the shims or the reward; it cannot
  reach this view through ``/proc/PID/root`` either (the command keeps one capability more
  than the agent's commands, ``CAP_WAKE_ALARM``, so the kernel refuses the agent's processes
  ptrace access to it). So the verifier no longer kills what the agent left running (as under
  Harbor: services stay up for every task).

The command (with ``kill_leftovers``, which :func:`~rollbank.episodes.verifier.run_verifier` no
longer passes, it first kills the leftovers; the sandbox has already killed them by
cgroup), unpacks the tests and shims from its stdin (one tar), runs ``task.test_command``
with its output into the private output directory, and prints ``@@rb rc N`` then the test
command's stdout and stderr tails, the shim error, ``reward.txt`` and ``reward.json``, one
line each (``F <base64>`` or ``N`` for missing), which are classified exactly as the
unpinned verifier's (:func:`~rollbank.episodes.verifier.classify`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import tarfile

from rollbank.episodes.verifier_result import (
    KILL_LEFTOVERS,
    OUTPUT_LIMIT,
    REWARD_JSON,
    REWARD_TXT,
    SHIM_ERROR,
    TOOLCHAIN_PINS,
    VERIFIER_ENV,
    VerifierResult,
    VerifierStatus,
    classify,
    shim_crash,
    test_files,
)
from rollbank.sandbox.protocol import ExecResult, PinnedExec
from rollbank.tasks.model import Task
from rollbank.tasks.shims import SHIM_DIR, shim_files

#: The command's own scratch (a top-level directory of its assembled root: see ``csrc/pins.c``).
SCRATCH = "/.rollbank-verifier"
OUT_DIR = f"{SCRATCH}/out"
TMP_DIR = f"{SCRATCH}/tmp"  # TMPDIR: what the tests' tools create is private (no /tmp races)
#: Fresh directories private to the verifier's command.
PRIVATE = ("+/tests", "+/logs/verifier", "+" + SHIM_DIR, "+" + OUT_DIR, "+" + TMP_DIR)
TAIL = 65536
_FILES = (f"{OUT_DIR}/stdout", f"{OUT_DIR}/stderr", SHIM_ERROR, REWARD_TXT, REWARD_JSON)
_SCRIPT = (
    "mkdir -p /logs/agent 2>/dev/null; "
    "if ! tar -x --no-same-owner -C /; then echo '@@rb prepare-failed'; exit 0; fi\n"
    f'export PATH={SHIM_DIR}:"$PATH"; export HOME="${{HOME:-/root}}" TMPDIR={TMP_DIR}\n'
    f'/bin/bash -c "$ROLLBANK_TEST_COMMAND" > {OUT_DIR}/stdout 2> {OUT_DIR}/stderr < /dev/null\n'
    'echo "@@rb rc $?"\n'
    f"for f in {' '.join(_FILES)}; do "
    f'if [ -f "$f" ]; then printf "F "; tail -c {TAIL} -- "$f" | base64 -w0; echo; '
    "else echo N; fi; done\n"
)


def _payload(task: Task) -> bytes:
    """One tar: ``tests/...`` and the shims, modes kept (read on the host, off the loop)."""
    files: list[tuple[str, bytes, int]] = [
        (f"tests/{rel}", p.read_bytes(), 0o755 if p.stat().st_mode & 0o111 else 0o644)
        for rel, p in test_files(task.tests_dir) + list(task.extra_test_files)]
    files += [(f"{SHIM_DIR.lstrip('/')}/{name}", data, mode)
              for name, (data, mode) in shim_files().items()]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs: set[str] = set()
        for rel, data, mode in files:
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def parse(res: ExecResult) -> tuple[ExecResult, list[str | None]] | None:
    """The test command's own result and the files, from the pinned command's stdout; None
    when it did not get as far as running the tests."""
    lines = res.stdout.splitlines()
    at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("@@rb rc ")), None)
    if at is None or len(lines) < at + 1 + len(_FILES):
        return None
    rc = int(lines[at].split()[-1])
    files = [base64.b64decode(ln[2:]).decode("utf-8", "replace") if ln.startswith("F ") else None
             for ln in lines[at + 1: at + 1 + len(_FILES)]]
    exit_code, signal = (None, rc - 128) if rc > 128 else (rc, None)
    test = dataclasses.replace(res, exit_code=exit_code, signal=signal, stdout=files[0] or "",
                               stderr=files[1] or "")
    return test, files


async def run_pinned(sandbox: PinnedExec, task: Task, *, timeout_s: float,
                     kill_leftovers: bool) -> VerifierResult:
    if kill_leftovers:
        await sandbox.kill_leftovers()  # by cgroup: nothing forks its way past it
    payload = await asyncio.to_thread(_payload, task)
    env = {**VERIFIER_ENV, **task.verifier_env, "ROLLBANK_TEST_COMMAND": task.test_command}
    script = (KILL_LEFTOVERS if kill_leftovers else "") + _SCRIPT
    res = await sandbox.exec_pinned(["/bin/sh", "-c", script], pins=(*TOOLCHAIN_PINS, *PRIVATE),
                                    env=env, stdin=payload, timeout_s=timeout_s,
                                    output_limit=OUTPUT_LIMIT)
    return dataclasses.replace(_classify(res), pinned=True)


def _classify(res: ExecResult) -> VerifierResult:
    if res.timed_out or res.budget_exhausted or res.host_stalled:
        return classify(res, None, None)
    parsed = parse(res)
    if parsed is None:
        return VerifierResult(VerifierStatus.CRASH, None, exit_code=res.exit_code,
                              signal=res.signal, stdout_tail=res.stdout[-4000:],
                              stderr_tail=res.stderr[-4000:], duration_s=res.duration_s,
                              error="could not prepare /tests and /logs/verifier")
    test, (_, _, shim_error, txt, js) = parsed
    if shim_error is not None:
        return shim_crash(test, shim_error)
    return classify(test, txt, None if txt is not None else js)

