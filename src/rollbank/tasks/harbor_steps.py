"""Harbor schema 1.1 additions: ``[[steps]]`` (multi-step tasks), artifacts, skills, MCP servers.

Owns: reading these parts of ``task.toml`` and the ``steps/<name>/`` folders into
:class:`~rollbank.tasks.model.TaskStep` and the skill list. Errors are
:class:`~rollbank.errors.TaskError` naming ``task.toml`` and the dotted field (``steps[1].name``)
or the step's file.

Layout of a multi-step task: ``steps/<name>/instruction.md`` (required), ``steps/<name>/tests/``
(layered over the task-level ``tests/``; a ``test.sh`` must exist in one of them),
``steps/<name>/solution/solve.sh`` (the step's oracle, optional), ``steps/<name>/workdir/``
(merged into the working directory before the step; optional). ``[[steps]]`` keys: ``name``,
``min_reward`` (number or table of numbers), ``contributes_to_mean``, ``artifacts``,
``[steps.agent] timeout_sec``, ``[steps.verifier] timeout_sec`` and ``env``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollbank.errors import TaskError
from rollbank.tasks import folder
from rollbank.tasks.config import LoaderConfig
from rollbank.tasks.folder import Fields
from rollbank.tasks.model import MinReward, TaskStep

STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
KNOWN_STEP = {"name", "min_reward", "contributes_to_mean", "artifacts", "agent", "verifier"}
STRATEGIES = ("mean", "final")


def steps(top: Fields, root: Path, config: LoaderConfig, warnings: list[str]) -> tuple[TaskStep, ...]:
    """The ``[[steps]]`` of ``task.toml`` (empty for a single-step task)."""
    top.used.add("steps")
    raw = top.data.get("steps")
    if raw is None:
        if (root / "steps").is_dir():
            warnings.append("steps/ ignored: task.toml declares no [[steps]]")
        return ()
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise TaskError("expected a non-empty array of tables ([[steps]])", file=top.file, field="steps")
    out: list[TaskStep] = []
    seen: set[str] = set()
    for i, table in enumerate(raw):
        f = Fields(table, file=top.file, prefix=f"steps[{i}].")
        name = f.string("name", required=True)
        assert name is not None
        if not STEP_NAME.fullmatch(name):
            raise TaskError(f"step name {name!r} must be letters, digits, '.', '_' or '-'",
                            file=top.file, field=f"steps[{i}].name")
        if name in seen:
            raise TaskError(f"duplicate step name {name!r}", file=top.file, field=f"steps[{i}].name")
        seen.add(name)
        out.append(_step(f, i, name, root, config, warnings))
    return tuple(out)


def _step(f: Fields, i: int, name: str, root: Path, config: LoaderConfig,
          warnings: list[str]) -> TaskStep:
    sdir = root / "steps" / name
    if not sdir.is_dir():
        raise TaskError(f"step {name!r} has no folder steps/{name}/", file=f.file, field=f"steps[{i}].name")
    text = folder.read_text(sdir / "instruction.md", config)
    assert text is not None
    if not text.strip():
        raise TaskError("instruction is empty", file=sdir / "instruction.md")
    tests = sdir / "tests"
    if not (tests / "test.sh").is_file() and not (root / "tests" / "test.sh").is_file():
        raise TaskError(f"step {name!r} has no test.sh (steps/{name}/tests/ or tests/)",
                        file=tests / "test.sh")
    solve = sdir / "solution" / "solve.sh"
    if solve.exists() or solve.is_symlink():
        folder.check_inside(root, solve, what="solution script")
    agent, verifier = f.table("agent"), f.table("verifier")
    step = TaskStep(
        name=name, instruction=text, tests_dir=tests if tests.is_dir() else None,
        solution=solve if solve.exists() else None,
        min_reward=min_reward(f),
        agent_timeout_s=agent.number("timeout_sec", 0.0, minimum=-1.0) or None,
        verifier_timeout_s=verifier.number("timeout_sec", 0.0, minimum=-1.0) or None,
        verifier_env=verifier.env("env"),
        artifacts=artifacts(f),
        setup_dir=sdir / "workdir" if (sdir / "workdir").is_dir() else None,
        contributes_to_mean=f.boolean("contributes_to_mean", True),
    )
    for table in (f, agent, verifier):
        for key in table.unknown(KNOWN_STEP if table is f else set()):
            warnings.append(f"task.toml: unknown key {key!r} ignored")
    return step


def min_reward(f: Fields) -> MinReward | None:
    f.used.add("min_reward")
    value = f.data.get("min_reward")
    where = f"{f.prefix}min_reward"
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(k): _reward_number(v, f, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TaskError(f"expected a number or a table of numbers, got {value!r}", file=f.file, field=where)
    return _reward_number(value, f, where)


def _reward_number(v: object, f: Fields, where: str) -> float:
    """A finite reward threshold (TOML admits nan, inf and integers past a float's range)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TaskError(f"expected a number, got {v!r}", file=f.file, field=where)
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise TaskError(f"expected a finite number, got {v!r}", file=f.file, field=where)
    return x


def artifacts(f: Fields) -> tuple[str, ...]:
    """``artifacts``: paths (strings) or ``{source = ..., destination = ...}`` tables."""
    f.used.add("artifacts")
    value = f.data.get("artifacts", [])
    where = f"{f.prefix}artifacts"
    if not isinstance(value, list):
        raise TaskError(f"expected an array, got {value!r}", file=f.file, field=where)
    out = []
    for j, item in enumerate(value):
        src = item.get("source") if isinstance(item, dict) else item
        if not isinstance(src, str) or not src:
            raise TaskError(f"expected a path or a table with 'source', got {item!r}", file=f.file,
                            field=f"{where}[{j}]")
        out.append(src)
    return tuple(out)


def strategy(top: Fields) -> str:
    value = top.string("multi_step_reward_strategy", "mean")
    if value not in STRATEGIES:
        raise TaskError(f"expected one of {STRATEGIES}, got {value!r}", file=top.file,
                        field="multi_step_reward_strategy")
    assert value is not None
    return value


def refuse_mcp_servers(data: Mapping[str, Any], file: Path) -> None:
    """MCP server declarations need sidecar services rollbank cannot run: a clear error."""
    for where, table in (("", data), ("environment.", data.get("environment")),
                         ("agent.", data.get("agent"))):
        if isinstance(table, dict) and table.get("mcp_servers"):
            raise TaskError("MCP servers are not supported (rollbank runs no sidecar services); "
                            "remove the declaration or run this task with Harbor",
                            file=file, field=f"{where}mcp_servers")


def skills(envt: Fields, root: Path, config: LoaderConfig) -> tuple[str | None, Path | None, tuple[tuple[str, str], ...]]:
    """``[environment] skills_dir`` -> (path in the environment, host folder to copy, skills)."""
    where = envt.string("skills_dir")
    if where is None:
        return None, None, ()
    if not where.startswith("/"):
        raise TaskError(f"skills_dir must be an absolute path inside the environment, got {where!r}",
                        file=envt.file, field="environment.skills_dir")
    source = root / "environment" / "skills"
    if not source.is_dir():
        return where, None, ()
    found = []
    for md in sorted(source.glob("*/SKILL.md")):
        text = folder.read_text(md, config) or ""
        meta = _front_matter(text)
        found.append((meta.get("name", md.parent.name), meta.get("description", "")))
    return where, source, tuple(found)


def _front_matter(text: str) -> dict[str, str]:
    if not text.startswith("---"):
        return {}
    head = text[3:].split("\n---", 1)[0]
    out = {}
    for line in head.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and not line.startswith(" "):
            out[key.strip()] = value.strip().strip("\"'")
    return out
