"""Find and load tasks: the one entry point other layers call (:func:`load_tasks`).

A PATH is a task folder (Harbor: ``task.toml``/``instruction.md``; Terminal-Bench 1:
``task.yaml``), a folder of task folders (loaded in name order, non-task sub-folders such as
``.git`` skipped), or the name of a built-in suite (``terminal-lite`` ->
``src/rollbank/tasks/suites/terminal-lite``).

Invariants
- Loading reads files and writes nothing (except the content-addressed TB1 solution
  conversion, see :mod:`rollbank.tasks.tbench`), so a failure leaves no half-built state.
- Task ids are unique across the returned list; a duplicate is a :class:`TaskError`.
- Errors name the file and field (or line) at fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollbank.errors import InputError, TaskError
from rollbank.tasks import harbor, tbench
from rollbank.tasks.config import LoaderConfig
from rollbank.tasks.model import Task

SUITES_DIR = Path(__file__).parent / "suites"


def builtin_suites() -> list[str]:
    return sorted(p.name for p in SUITES_DIR.iterdir() if p.is_dir()) if SUITES_DIR.is_dir() else []


def is_task_dir(path: Path) -> bool:
    return tbench.is_tbench(path) or harbor.is_harbor(path)


def load_task(path: Path | str, config: LoaderConfig | None = None) -> Task:
    """Load a single task folder in whichever format it is."""
    p = Path(path)
    if tbench.is_tbench(p):
        return tbench.load(p, config)
    if harbor.is_harbor(p):
        if not (p / "task.toml").is_file():
            raise TaskError("required file is missing", file=p / "task.toml")
        return harbor.load(p, config)
    raise TaskError("not a task folder (no task.toml, instruction.md or task.yaml)", file=p)


def resolve_paths(paths: Sequence[Path | str]) -> list[Path]:
    """Expand PATH arguments into task folders (built-in suite names included)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists() and str(raw) in builtin_suites():
            p = SUITES_DIR / str(raw)
        if not p.exists():
            raise TaskError(f"no such task folder or suite (built-in: {', '.join(builtin_suites()) or 'none'})",
                            file=p)
        if not p.is_dir():
            raise TaskError("expected a task folder or a folder of task folders", file=p)
        if is_task_dir(p):
            out.append(p)
            continue
        children = sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith("."))
        found = [c for c in children if is_task_dir(c)]
        if not found:
            raise TaskError("contains no task folders", file=p)
        out.extend(found)
    return out


def load_tasks(paths: Sequence[Path | str], config: LoaderConfig | None = None) -> list[Task]:
    """Load every task under ``paths``; raises :class:`TaskError` on the first bad one."""
    tasks = [load_task(p, config) for p in resolve_paths(paths)]
    seen: dict[str, Path] = {}
    for t in tasks:
        if t.task_id in seen:
            raise TaskError(f"duplicate task id {t.task_id!r} (also {seen[t.task_id]})", file=t.path)
        seen[t.task_id] = t.path
    return tasks


@dataclass(frozen=True)
class LoadFailure:
    """A PATH (or one task folder under it) that did not load, and why."""

    path: Path
    error: InputError

    @property
    def task_id(self) -> str:
        return self.path.name


def load_each(paths: Sequence[Path | str], config: LoaderConfig | None = None) -> list[Task | LoadFailure]:
    """Load every task under ``paths``, going on past bad ones (``rollbank tasks validate``).

    Each PATH that cannot be expanded, each task folder that fails to load and each duplicate
    task id is a :class:`LoadFailure` in its place; the others are loaded tasks, in order.
    """
    out: list[Task | LoadFailure] = []
    seen: dict[str, Path] = {}
    for raw in paths:
        try:
            folders = resolve_paths([raw])
        except InputError as exc:
            out.append(LoadFailure(Path(raw), exc))
            continue
        for folder_path in folders:
            try:
                task = load_task(folder_path, config)
                if task.task_id in seen:
                    raise TaskError(f"duplicate task id {task.task_id!r} (also {seen[task.task_id]})",
                                    file=task.path)
            except InputError as exc:
                out.append(LoadFailure(folder_path, exc))
                continue
            seen[task.task_id] = task.path
            out.append(task)
    return out
