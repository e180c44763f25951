"""Which tasks a collection runs and in what order: ``include``/``exclude_costs``/saturated-task
filters over the loaded suites, the seeded task order, and the tasks whose warm snapshots are
made before the clock starts."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from rollbank.collect_config import CollectConfig
from rollbank.errors import ConfigError, InputError
from rollbank.tasks.loader import load_tasks
from rollbank.tasks.model import Task


def select_tasks(config: CollectConfig) -> list[Task]:
    tasks = load_tasks(config.tasks)
    if config.include:
        wanted = set(config.include)
        tasks = [t for t in tasks if t.task_id in wanted]
    if config.exclude_costs:
        tasks = [t for t in tasks if (t.cost or "") not in config.exclude_costs]
    if config.exclude_saturated_from:
        saturated = saturated_tasks(Path(config.exclude_saturated_from))
        tasks = [t for t in tasks if t.task_id not in saturated]
    if not tasks:
        raise ConfigError("no task left after include/exclude_costs/exclude_saturated_from",
                          field="tasks")
    return tasks


def saturated_tasks(path: Path) -> set[str]:
    """The tasks a task-health file (``evaluation/health.py``) lists as saturated."""
    try:
        return {str(t) for t in json.loads(path.read_text())["saturated"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"unreadable task-health file: {exc}", file=path,
                         field="exclude_saturated_from") from exc


def task_sequence(tasks: Sequence[Task], seed: int | None) -> list[str]:
    ids = sorted(t.task_id for t in tasks)
    if seed is not None:
        random.Random(seed).shuffle(ids)
    return ids


def tasks_to_prepare(config: CollectConfig, tasks: Sequence[Task]) -> list[Task]:
    """The tasks the first groups will run (warm snapshots made before the clock starts)."""
    sched = config.scheduler.effective()
    groups = sched.pool_groups + (sched.num_batches - 1) * sched.groups_per_batch
    ids = task_sequence(tasks, config.task_order_seed)
    wanted = {ids[k % len(ids)] for k in range(groups + sched.groups_per_batch)}
    return [t for t in tasks if t.task_id in wanted]
