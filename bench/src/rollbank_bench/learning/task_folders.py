"""The addition family as Harbor task folders, for the real loop (``--engine vllm``).

Each :class:`~rollbank_bench.learning.tasks.AdditionTask` becomes a folder the task loader
reads like any other Harbor task: ``instruction.md`` is the prompt (``Q: 13+7=? A:``; the
answer-line harness sends it as it is), the environment is an empty ``/app`` on ubuntu, and
``tests/test.sh`` is the verifier: reward 1 when ``/app/answer.txt`` holds the integer
``a + b`` (whitespace ignored; answers are never negative), else 0. The sandbox runs whatever command the model
wrote, so this is the in-process :func:`~rollbank_bench.learning.tasks.verify` made real (it
also passes ``printf 20 > answer.txt``, which the in-process check does not).

Folders are content-addressed by the task list and written once under ``root``.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path

from rollbank_bench.learning.tasks import AdditionTask

TASK_TOML = """version = "1.0"

[metadata]
author_name = "rollbank"
difficulty = "easy"
category = "learning"
tags = ["learning", "addition", "level-{level}"]
cost = "cheap"

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 30.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 256
storage_mb = 256
allow_internet = false
"""

DOCKERFILE = "FROM ubuntu:24.04\nWORKDIR /app\n"

TEST_SH = """#!/bin/bash
# Verifier: reward 1 when /app/answer.txt holds the integer {answer}, else 0.
mkdir -p /logs/verifier
v="$(tr -d '[:space:]' 2>/dev/null < /app/answer.txt)"
if [[ "$v" =~ ^[0-9]{{1,9}}$ ]] && [ "$((10#$v))" -eq {answer} ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

SOLVE_SH = "#!/bin/bash\nset -e\necho {answer} > /app/answer.txt\n"


def folder_name(task: AdditionTask) -> str:
    return f"add-l{task.level}-{task.a}-plus-{task.b}"


def unique(tasks: Sequence[AdditionTask]) -> list[AdditionTask]:
    """``tasks`` without repeats (first occurrence kept, order kept)."""
    seen: set[str] = set()
    out = []
    for t in tasks:
        if folder_name(t) not in seen:
            seen.add(folder_name(t))
            out.append(t)
    return out


def write_task(root: Path, task: AdditionTask) -> Path:
    d = root / folder_name(task)
    (d / "environment").mkdir(parents=True, exist_ok=True)
    (d / "tests").mkdir(exist_ok=True)
    (d / "solution").mkdir(exist_ok=True)
    (d / "instruction.md").write_text(task.prompt + "\n")
    (d / "task.toml").write_text(TASK_TOML.format(level=task.level))
    (d / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (d / "tests" / "test.sh").write_text(TEST_SH.format(answer=task.answer))
    (d / "solution" / "solve.sh").write_text(SOLVE_SH.format(answer=task.answer))
    return d


def write_suite(root: Path, name: str, tasks: Sequence[AdditionTask]) -> Path:
    """The folder ``root/<name>-<hash>`` holding one task folder per distinct task (cached)."""
    tasks = unique(tasks)
    key = hashlib.sha256("\n".join(folder_name(t) for t in tasks).encode()).hexdigest()[:12]
    out = root / f"{name}-{key}"
    if (out / ".complete").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for t in tasks:
        write_task(tmp, t)
    (tmp / ".complete").write_text(f"{len(tasks)}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
