"""Terminal-Bench 1 task folders -> :class:`~rollbank.tasks.model.Task`.

Layout: ``task.yaml``, ``Dockerfile`` (build context: the task folder), optional
``docker-compose.yaml`` (only the single ``client`` service is honoured, through the
Dockerfile), ``tests/`` (copied to ``/tests`` after the agent finished), optional
``run-tests.sh`` (copied to ``/tests/run-tests.sh``), ``solution.sh`` or ``solution.yaml``.

task.yaml fields read: ``instruction`` (required; the older ``descriptions: [{key: base,
description: ...}]`` form is accepted), ``difficulty``, ``category``, ``tags``,
``max_agent_timeout_sec`` [360], ``max_test_timeout_sec`` [60], ``run_tests_in_same_shell``
(kept in ``extra``: rollbank always runs the tests after the agent, in the same sandbox).
Other keys are kept in ``Task.extra`` with a warning.

Reward: Terminal-Bench 1 has no reward file; its harness parses pytest's ``-rA`` summary. The
test command is wrapped by the ``rollbank-tb1-verify`` shim (see
:mod:`rollbank.tasks.shims`), which runs it, parses the summary and writes
``/logs/verifier/reward.txt`` (1 when at least one test passed and none failed or errored).

``solution.yaml`` (keystroke commands for tmux) is turned into a shell script, one command per
line, written content-addressed under ``<cache>/tb1-solutions/`` (atomic rename): an
approximation recorded in the task's warnings.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from rollbank.config import cache_dir
from rollbank.errors import TaskError
from rollbank.tasks import folder
from rollbank.tasks.config import LoaderConfig
from rollbank.tasks.folder import Fields
from rollbank.tasks.model import Task, TaskFormat

KNOWN = {"instruction", "descriptions", "author_name", "author_email", "difficulty", "category",
         "tags", "parser_name", "max_agent_timeout_sec", "max_test_timeout_sec",
         "run_tests_in_same_shell", "expert_time_estimate_min", "junior_time_estimate_min",
         "disable_asciinema", "estimated_duration_sec", "cost"}


def is_tbench(path: Path) -> bool:
    return (path / "task.yaml").is_file()


def load(path: Path, config: LoaderConfig | None = None) -> Task:
    """Load one Terminal-Bench 1 task folder; raises :class:`TaskError` naming file and field."""
    config = config or LoaderConfig()
    root = path.resolve()
    content_hash = folder.scan(root, config)
    yaml_path = root / "task.yaml"
    data = folder.load_yaml(yaml_path, config)
    f = Fields(data, file=yaml_path)
    instruction = f.string("instruction")
    if instruction is None:
        instruction = _from_descriptions(data, yaml_path)
    f.used.add("descriptions")
    if not instruction.strip():
        raise TaskError("instruction is empty", file=yaml_path, field="instruction")
    parser = f.string("parser_name", "pytest")
    if parser != "pytest":
        raise TaskError(f"parser {parser!r} is not supported (only pytest)", file=yaml_path,
                        field="parser_name")

    dockerfile = root / "Dockerfile"
    if not dockerfile.is_file():
        raise TaskError("Dockerfile is missing", file=dockerfile)
    folder.check_inside(root, dockerfile, what="Dockerfile")
    folder.check_dockerfile(dockerfile, root)
    warnings: list[str] = []
    compose = root / "docker-compose.yaml"
    if compose.is_file():
        _check_compose(compose, config, warnings)

    tests_dir = root / "tests"
    run_tests = root / "run-tests.sh"
    extra_files: tuple[tuple[str, Path], ...] = ()
    if run_tests.exists() or run_tests.is_symlink():
        folder.check_inside(root, run_tests, what="run-tests.sh")
        extra_files = (("run-tests.sh", run_tests),)
        command = "rollbank-tb1-verify bash /tests/run-tests.sh"
    elif (tests_dir / "test_outputs.py").is_file():
        command = "rollbank-tb1-verify python3 -m pytest /tests/test_outputs.py -rA"
    else:
        raise TaskError("neither run-tests.sh nor tests/test_outputs.py exists", file=tests_dir)
    if tests_dir.exists():
        folder.check_inside(root, tests_dir, what="tests folder")

    agent_timeout = f.number("max_agent_timeout_sec", 360.0)
    test_timeout = f.number("max_test_timeout_sec", 60.0)
    difficulty, category, tags = f.string("difficulty"), f.string("category"), f.strings("tags")
    extra = {k: v for k, v in data.items() if k not in KNOWN}
    warnings += [f"task.yaml: unknown key {k!r} kept, not used" for k in extra]
    extra["run_tests_in_same_shell"] = f.boolean("run_tests_in_same_shell", False)
    solution = _solution(root, content_hash, config, warnings)  # last: it may write a file
    return Task(
        task_id=root.name,
        path=root,
        format=TaskFormat.TERMINAL_BENCH_1,
        content_hash=content_hash,
        instruction=instruction,
        dockerfile=dockerfile,
        context_dir=root,
        tests_dir=tests_dir,
        test_command=command,
        solution=solution,
        agent_timeout_s=agent_timeout,
        verifier_timeout_s=test_timeout,
        build_timeout_s=600.0,
        verifier_env={"TEST_DIR": "/tests"},
        difficulty=difficulty,
        category=category,
        tags=tags,
        cost=None if data.get("cost") is None else str(data["cost"]),
        extra_test_files=extra_files,
        extra=extra,
        warnings=tuple(warnings),
    )


def _from_descriptions(data: dict[str, object], file: Path) -> str:
    descs = data.get("descriptions")
    if isinstance(descs, list):
        for d in descs:
            if isinstance(d, dict) and d.get("key", "base") == "base" and isinstance(d.get("description"), str):
                return str(d["description"])
    raise TaskError("required field is missing", file=file, field="instruction")


def _check_compose(path: Path, config: LoaderConfig, warnings: list[str]) -> None:
    data = folder.load_yaml(path, config)
    services = data.get("services")
    if not isinstance(services, dict):
        raise TaskError("expected a 'services' mapping", file=path, field="services")
    if set(services) != {"client"}:
        raise TaskError(f"only a single 'client' service is supported, found {sorted(map(str, services))}",
                        file=path, field="services")
    warnings.append("docker-compose.yaml: only the Dockerfile of service 'client' is used")


def _solution(root: Path, content_hash: str, config: LoaderConfig, warnings: list[str]) -> Path | None:
    script = root / "solution.sh"
    if script.exists() or script.is_symlink():
        folder.check_inside(root, script, what="solution.sh")
        return script
    spec = root / "solution.yaml"
    if not spec.exists():
        return None
    text = folder.read_text(spec, config)
    try:
        items = yaml.safe_load(text or "")
    except yaml.YAMLError as exc:
        raise TaskError(f"invalid YAML: {exc}", file=spec) from exc
    except RecursionError as exc:
        raise TaskError("invalid YAML: nested too deeply", file=spec) from exc
    if not isinstance(items, list):
        raise TaskError("expected a list of {command: ...} entries", file=spec)
    lines = ["#!/bin/bash", "# generated by rollbank from solution.yaml (keystrokes -> commands)"]
    for i, item in enumerate(items):
        command = item.get("command") if isinstance(item, dict) else None
        if not isinstance(command, str):
            raise TaskError("expected a string", file=spec, field=f"[{i}].command")
        lines.append(command.rstrip("\n"))
    warnings.append("solution.yaml approximated: its commands run as one bash script")
    out_dir = cache_dir() / "tb1-solutions"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{content_hash[:24]}.sh"
    if not target.exists():
        tmp = out_dir / f".{target.name}.{os.getpid()}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(target)
    return target
