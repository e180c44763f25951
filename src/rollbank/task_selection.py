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
    """The loaded ``tasks`` after ``include``, ``exclude_costs`` and ``exclude_saturated_from``;
    an empty selection is a :class:`ConfigError` naming the filter that emptied it, what it
    removed and how to undo it."""
    tasks = load_tasks(config.tasks)
    if not tasks:
        raise ConfigError(f"no task found in {config.tasks}", field="tasks")
    if config.include:
        wanted = set(config.include)
        kept = [t for t in tasks if t.task_id in wanted]
        if not kept:
            raise ConfigError(
                f"include = {sorted(wanted)} keeps none of the {len(tasks)} task(s) of "
                f"{config.tasks} ({_ids(tasks)}); list their ids (--set 'include=[\"{tasks[0].task_id}\"]') "
                "or take them all (--set 'include=[]')", field="include")
        tasks = kept
    if config.exclude_costs:
        kept = [t for t in tasks if (t.cost or "") not in config.exclude_costs]
        if not kept:
            raise ConfigError(
                f"exclude_costs = {list(config.exclude_costs)} removes every remaining task "
                f"({_ids(tasks)}: cost {sorted({t.cost or '' for t in tasks})}); keep them with "
                "--set 'exclude_costs=[]'", field="exclude_costs")
        tasks = kept
    if config.exclude_saturated_from:
        saturated = saturated_tasks(Path(config.exclude_saturated_from))
        kept = [t for t in tasks if t.task_id not in saturated]
        if not kept:
            raise ConfigError(
                f"exclude_saturated_from = {config.exclude_saturated_from} lists every remaining "
                f"task as saturated ({_ids(tasks)}); unset it (--set 'exclude_saturated_from=null')",
                field="exclude_saturated_from")
        tasks = kept
    return tasks


def _ids(tasks: Sequence[Task], shown: int = 5) -> str:
    ids = sorted(t.task_id for t in tasks)
    return ", ".join(ids[:shown]) + (f", ... ({len(ids)} in all)" if len(ids) > shown else "")


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
