"""Task-set health: per-task solve rates across batches and evaluations.

Sources are collection outputs (a run folder with ``batches/``, a ``batches/`` folder, or one
``batch-NNNNNN`` folder: its ``trajectories.parquet``) and evaluation outputs (a folder with
``eval.json``, or the file). Every source gives, per task, attempts and successes, and per
group whether its outcomes all agree (a zero-variance group: no learning signal). A task is
``saturated`` when every one of its (at least ``min_attempts``) attempts succeeded and
``never_solved`` when none did. The health file (``--out``) lists the saturated tasks under
``saturated``; a collect config's ``exclude_saturated_from`` rotates them out of sampling.

Batches hold trainable attempts only (model success / failure); evaluations count every
attempt (an infra failure is an unsolved attempt there).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbank.errors import InputError


@dataclass
class SourceCounts:
    """What one source says: ``task -> [attempts, successes]`` and its groups' variance."""

    source: str
    tasks: dict[str, list[int]] = field(default_factory=dict)
    groups: int = 0
    zero_variance_groups: int = 0

    def add_group(self, task: str, successes: Sequence[bool]) -> None:
        c = self.tasks.setdefault(task, [0, 0])
        c[0] += len(successes)
        c[1] += sum(successes)
        self.groups += 1
        self.zero_variance_groups += len(set(successes)) <= 1


def health(sources: Iterable[SourceCounts], *, min_attempts: int = 1) -> dict[str, Any]:
    """Per-task solve rates over all sources, with saturated / never-solved flags."""
    srcs = list(sources)
    tasks: dict[str, dict[str, Any]] = {}
    for s in srcs:
        for task, (n, c) in s.tasks.items():
            t = tasks.setdefault(task, {"attempts": 0, "successes": 0, "by_source": {}})
            t["attempts"] += n
            t["successes"] += c
            t["by_source"][s.source] = {"attempts": n, "successes": c,
                                        "solve_rate": c / n if n else None}
    for t in tasks.values():
        n, c = t["attempts"], t["successes"]
        t["solve_rate"] = c / n if n else None
        enough = n >= min_attempts and n > 0
        t["flag"] = ("saturated" if enough and c == n else
                     "never_solved" if enough and c == 0 else None)
    ordered = dict(sorted(tasks.items()))
    return {
        "sources": [s.source for s in srcs],
        "min_attempts": min_attempts,
        "tasks": ordered,
        "saturated": [k for k, t in ordered.items() if t["flag"] == "saturated"],
        "never_solved": [k for k, t in ordered.items() if t["flag"] == "never_solved"],
        "groups": sum(s.groups for s in srcs),
        "zero_variance_groups": sum(s.zero_variance_groups for s in srcs),
    }


def from_eval(doc: dict[str, Any], source: str) -> list[SourceCounts]:
    """One source per row (model) of an ``eval.json``; a task's attempts are one group."""
    out = []
    for row in doc.get("rows", []):
        s = SourceCounts(f"{source}:{row.get('model')}")
        for task, d in (row.get("per_task") or {}).items():
            n, c = int(d["n"]), int(d["successes"])
            s.add_group(task, [True] * c + [False] * (n - c))
        out.append(s)
    return out


def from_batch_dirs(batch_dirs: Sequence[Path], source: str) -> SourceCounts:
    """A collection's batches (``trajectories.parquet`` of each)."""
    import pyarrow.parquet as pq

    s = SourceCounts(source)
    for d in batch_dirs:
        table = pq.read_table(d / "trajectories.parquet", columns=["group_id", "task_id", "outcome"])
        groups: dict[tuple[str, str], list[bool]] = {}
        for gid, task, outcome in zip(*(table.column(c).to_pylist() for c in
                                        ("group_id", "task_id", "outcome")), strict=True):
            groups.setdefault((gid, task), []).append(outcome == "model_success")
        for (_, task), succ in groups.items():
            s.add_group(task, succ)
    return s


def load_sources(paths: Sequence[Path]) -> list[SourceCounts]:
    """Read every path (see the module doc); an unreadable one raises :class:`InputError`."""
    out: list[SourceCounts] = []
    for p in paths:
        eval_file = p / "eval.json" if p.is_dir() else p
        if eval_file.name == "eval.json" and eval_file.is_file():
            try:
                out += from_eval(json.loads(eval_file.read_text()), str(p))
            except (ValueError, KeyError, TypeError) as exc:
                raise InputError(f"unreadable evaluation: {exc}", file=eval_file) from exc
            continue
        if (p / "trajectories.parquet").is_file():
            dirs = [p]
        else:
            root = p / "batches" if (p / "batches").is_dir() else p
            dirs = sorted(d for d in root.glob("batch-*") if (d / "trajectories.parquet").is_file())
        if not dirs:
            raise InputError("no eval.json and no batch folders here", file=p)
        out.append(from_batch_dirs(dirs, str(p)))
    return out

