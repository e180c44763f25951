"""The campaign's tasks: small Harbor tasks on the python:3.12-slim environment.

``faults-ok-K`` (clean tasks: reward 1 when ``/app/done`` exists, by a Python verifier, so a
model that deletes the interpreter breaks it) and one task per verifier fault, whose tests
crash (exit 3, no reward), hang past the verifier timeout, or exit 0 without a reward —
everywhere, a pristine fork included: a broken verifier is the environment's fault.
Limits: 256 MiB memory, a 64 MiB writable layer, the default 512 processes.
"""

from __future__ import annotations

from pathlib import Path

from rollbank_bench.faults.kinds import FaultKind

OK_TESTS = ("python3 -c \"import os; open('/logs/verifier/reward.txt', 'w')"
            ".write('1' if os.path.exists('/app/done') else '0')\"\n")
VERIFIER_TESTS: dict[FaultKind, str] = {
    FaultKind.VERIFIER_CRASH: "echo 'injected verifier crash' >&2\nexit 3\n",
    FaultKind.VERIFIER_HANG: "sleep 600\n",
    FaultKind.VERIFIER_NO_REWARD: "echo 'tests ran, no reward written'\nexit 0\n",
}
VERIFIER_TIMEOUT_S = 3.0


def _task(root: Path, name: str, tests: str) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True, exist_ok=True)
    (d / "tests").mkdir(exist_ok=True)
    (d / "solution").mkdir(exist_ok=True)
    (d / "instruction.md").write_text("Fault campaign task: create /app/done.\n")
    (d / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("#!/bin/sh\n" + tests)
    (d / "solution" / "solve.sh").write_text("#!/bin/sh\ntouch /app/done\n")
    (d / "task.toml").write_text(
        'version = "1.0"\n[metadata]\ncost = "cheap"\n'
        f"[verifier]\ntimeout_sec = {VERIFIER_TIMEOUT_S}\n[agent]\ntimeout_sec = 120.0\n"
        "[environment]\ncpus = 1\nmemory_mb = 256\nstorage_mb = 64\n")
    return d


def task_id_kind(task_id: str) -> FaultKind | None:
    """The verifier fault a campaign task carries (None for a clean task)."""
    for kind in VERIFIER_TESTS:
        if task_id == f"faults-{kind.value.replace('_', '-')}":
            return kind
    return None


def write_tasks(root: Path, *, clean: int, verifier_faults: bool) -> list[Path]:
    """``clean`` clean tasks, plus one per verifier fault; their folders."""
    out = [_task(root, f"faults-ok-{k}", OK_TESTS) for k in range(clean)]
    if verifier_faults:
        out += [_task(root, f"faults-{k.value.replace('_', '-')}", t) for k, t in VERIFIER_TESTS.items()]
    return out
