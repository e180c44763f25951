"""Harbor (Terminal-Bench 2.x) task folders -> :class:`~rollbank.tasks.model.Task`.

Layout: ``instruction.md``, ``task.toml``, ``environment/Dockerfile`` (build context
``environment/``), ``tests/test.sh`` (copied to ``/tests`` only after the agent finished; run
as ``bash /tests/test.sh``), ``solution/solve.sh``, optional ``steps/<name>/`` each with its
own ``instruction.md`` and ``tests/``.

task.toml fields read (all optional, defaults in brackets): ``[agent] timeout_sec`` [600],
``[verifier] timeout_sec`` [600] and ``env``, ``[environment] build_timeout_sec`` [600],
``docker_image``, ``cpus`` [1], ``memory_mb`` [2048], ``storage_mb`` [10240],
``allow_internet`` [false], ``services`` [false] (rollbank's key: the verifier needs processes
the agent left running, e.g. a server on loopback; otherwise they are killed before
verification), ``workdir``, ``env``, ``[solution] env``, ``[metadata]
difficulty``, ``category``, ``tags``, ``cost``. Unknown keys are kept in ``Task.extra`` with a
warning (liberal in what we accept); wrong types are :class:`~rollbank.errors.TaskError`
naming ``task.toml`` and the dotted field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rollbank.errors import TaskError
from rollbank.tasks import folder
from rollbank.tasks.folder import Fields, LoaderConfig
from rollbank.tasks.model import Task, TaskFormat, TaskStep

KNOWN_TOP = {"version", "schema_version", "metadata", "agent", "verifier", "environment", "solution", "source"}
KNOWN_META = {"author_name", "author_email", "difficulty", "category", "tags", "cost",
              "expert_time_estimate_min", "junior_time_estimate_min", "estimated_duration_sec",
              "canary", "license", "name", "description"}


def is_harbor(path: Path) -> bool:
    return (path / "task.toml").is_file() or (path / "instruction.md").is_file()


def load(path: Path, config: LoaderConfig | None = None) -> Task:
    """Load one Harbor task folder; raises :class:`TaskError` naming file and field."""
    config = config or LoaderConfig()
    root = path.resolve()
    content_hash = folder.scan(root, config)
    toml_path = root / "task.toml"
    instruction = folder.read_text(root / "instruction.md", config)
    assert instruction is not None
    if not instruction.strip():
        raise TaskError("instruction is empty", file=root / "instruction.md")
    data = folder.load_toml(toml_path, config)
    top = Fields(data, file=toml_path)
    meta = top.table("metadata")
    agent = top.table("agent")
    verifier = top.table("verifier")
    envt = top.table("environment")
    solution_t = top.table("solution")

    tests_dir = root / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise TaskError("tests/test.sh is missing (the verifier entry point)", file=tests_dir / "test.sh")
    folder.check_inside(root, tests_dir / "test.sh", what="verifier script")

    env_dir = root / "environment"
    dockerfile: Path | None = env_dir / "Dockerfile"
    assert dockerfile is not None
    docker_image = envt.string("docker_image")
    if not dockerfile.is_file():
        if (env_dir / "docker-compose.yaml").exists() or (env_dir / "docker-compose.yml").exists():
            raise TaskError("multi-container (docker-compose) environments are not supported",
                            file=env_dir / "docker-compose.yaml")
        if docker_image is None:
            raise TaskError("no environment/Dockerfile and no [environment] docker_image",
                            file=toml_path, field="environment.docker_image")
        dockerfile = None
    else:
        folder.check_inside(root, dockerfile, what="Dockerfile")
        folder.check_dockerfile(dockerfile, env_dir)
    compose_ignored = dockerfile is not None and any(
        (env_dir / n).exists() for n in ("docker-compose.yaml", "docker-compose.yml"))

    solve = root / "solution" / "solve.sh"
    solution: Path | None = None
    if solve.exists() or solve.is_symlink():
        folder.check_inside(root, solve, what="solution script")
        solution = solve

    warnings: list[str] = []
    if compose_ignored:
        warnings.append("environment/docker-compose.yaml ignored: built from environment/Dockerfile")
    task = Task(
        task_id=root.name,
        path=root,
        format=TaskFormat.HARBOR,
        content_hash=content_hash,
        instruction=instruction,
        dockerfile=dockerfile,
        context_dir=env_dir,
        tests_dir=tests_dir,
        test_command="bash /tests/test.sh",
        solution=solution,
        agent_timeout_s=agent.number("timeout_sec", 600.0),
        verifier_timeout_s=verifier.number("timeout_sec", 600.0),
        build_timeout_s=envt.number("build_timeout_sec", 600.0),
        cpus=envt.number("cpus", 1.0),
        memory_mb=envt.integer("memory_mb", 2048),
        storage_mb=envt.integer("storage_mb", 10240),
        allow_internet=envt.boolean("allow_internet", False),
        services=envt.boolean("services", False),
        workdir=envt.string("workdir"),
        env=envt.env("env"),
        verifier_env=verifier.env("env"),
        difficulty=meta.string("difficulty"),
        category=meta.string("category"),
        tags=meta.strings("tags"),
        steps=_steps(root, config),
        cost=_cost(meta),
        docker_image=docker_image,
        solution_env=solution_t.env("env"),
        extra={},
        warnings=(),
    )
    if task.workdir is not None and not task.workdir.startswith("/"):
        raise TaskError(f"workdir must be absolute, got {task.workdir!r}", file=toml_path,
                        field="environment.workdir")
    extra: dict[str, object] = {}
    for table in (top, meta, agent, verifier, envt, solution_t):
        known = KNOWN_TOP if table is top else KNOWN_META if table is meta else set()
        for key, value in table.unknown(known).items():
            extra[key] = value
            warnings.append(f"{toml_path.name}: unknown key {key!r} kept, not used")
    return dataclasses.replace(task, extra=extra, warnings=tuple(warnings))


def _cost(meta: Fields) -> str | None:
    meta.used.add("cost")
    value = meta.data.get("cost")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TaskError(f"expected a string or number, got {value!r}", file=meta.file,
                        field=f"{meta.prefix}cost")
    return str(value)


def _steps(root: Path, config: LoaderConfig) -> tuple[TaskStep, ...]:
    steps_dir = root / "steps"
    if not steps_dir.is_dir():
        return ()
    steps = []
    for step in sorted(p for p in steps_dir.iterdir() if p.is_dir()):
        text = folder.read_text(step / "instruction.md", config)
        assert text is not None
        tests = step / "tests"
        steps.append(TaskStep(step.name, text, tests if tests.is_dir() else None))
    return tuple(steps)
