"""A loaded task: the format-independent description every other layer uses.

Loaders (:mod:`rollbank.tasks.harbor`, :mod:`rollbank.tasks.tbench`) turn a task folder into a
:class:`Task`. The content hash covers every file of the folder, so an episode records exactly
which task it ran and builds are cached by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class TaskFormat(StrEnum):
    HARBOR = "harbor"
    TERMINAL_BENCH_1 = "terminal-bench-1"


@dataclass(frozen=True)
class TaskStep:
    """One step of a multi-step Harbor task (steps/<name>/): its own instruction and tests."""

    name: str
    instruction: str
    tests_dir: Path | None


@dataclass(frozen=True)
class Task:
    task_id: str  # folder name, unique within a suite
    path: Path  # the task folder
    format: TaskFormat
    content_hash: str  # sha256 over the folder's files (relative path + bytes)
    instruction: str
    dockerfile: Path | None  # environment Dockerfile (None: base image only)
    context_dir: Path  # build context for COPY/ADD
    tests_dir: Path  # copied to /tests only after the agent finishes
    test_command: str  # what the verifier runs inside the sandbox (e.g. "bash /tests/test.sh")
    solution: Path | None  # oracle solution script
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    build_timeout_s: float = 600.0
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    allow_internet: bool = False
    # the verifier needs what the agent left running (a server on loopback): keep it; False:
    # every leftover agent process is killed before verification. Harbor: [environment] services
    services: bool = False
    workdir: str | None = None  # None: from the Dockerfile's last WORKDIR
    env: Mapping[str, str] = field(default_factory=dict)
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    difficulty: str | None = None
    category: str | None = None
    tags: tuple[str, ...] = ()
    steps: tuple[TaskStep, ...] = ()
    # --- added by the loaders (engineer A), additive ---
    cost: str | None = None  # [metadata] cost (e.g. "cheap", "expensive"), for listings
    docker_image: str | None = None  # [environment] docker_image (used when no Dockerfile)
    extra_test_files: tuple[tuple[str, Path], ...] = ()  # (name in /tests, host file), e.g. TB1 run-tests.sh
    solution_env: Mapping[str, str] = field(default_factory=dict)  # [solution] env
    extra: Mapping[str, object] = field(default_factory=dict)  # unknown config keys, kept verbatim
    warnings: tuple[str, ...] = ()  # non-fatal findings of the loader (unknown keys, ...)
