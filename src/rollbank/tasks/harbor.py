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
from rollbank.tasks import folder, harbor_steps
from rollbank.tasks.config import LoaderConfig
from rollbank.tasks.folder import Fields
from rollbank.tasks.model import Task, TaskFormat

KNOWN_TOP = {"version", "schema_version", "metadata", "agent", "verifier", "environment", "solution", "source",
             "task"}
KNOWN_AGENT = {"user"}
KNOWN_VERIFIER = {"user"}
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
    data = folder.load_toml(toml_path, config)
    harbor_steps.refuse_mcp_servers(data, toml_path)
    top = Fields(data, file=toml_path)
    meta = top.table("metadata")
    task_t = top.table("task")
    agent = top.table("agent")
    verifier = top.table("verifier")
    envt = top.table("environment")
    solution_t = top.table("solution")
    warnings: list[str] = []
    steps = harbor_steps.steps(top, root, config, warnings)
    instruction = folder.read_text(root / "instruction.md", config, required=not steps)
    if steps:
        if instruction is not None:
            warnings.append("instruction.md is not sent to the agent of a multi-step task")
        instruction = steps[0].instruction
    assert instruction is not None
    if not instruction.strip():
        raise TaskError("instruction is empty", file=root / "instruction.md")

    tests_dir = root / "tests"
    if steps and not (tests_dir / "test.sh").is_file():
        tests_dir = steps[0].tests_dir or tests_dir  # each step has a test.sh (checked)
    elif not (tests_dir / "test.sh").is_file():
        raise TaskError("tests/test.sh is missing (the verifier entry point)", file=tests_dir / "test.sh")
    if (tests_dir / "test.sh").exists():
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
    if steps:
        solution = steps[0].solution
    skills_dir, skills_source, skills = harbor_steps.skills(envt, root, config)
    tags = meta.strings("tags") or task_t.strings("keywords")
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
        tags=tags,
        steps=steps,
        cost=_cost(meta),
        docker_image=docker_image,
        solution_env=solution_t.env("env"),
        extra={},
        warnings=(),
        schema_version=str(data.get("schema_version") or data.get("version") or "") or None,
        multi_step_reward_strategy=harbor_steps.strategy(top),
        artifacts=harbor_steps.artifacts(top),
        skills_dir=skills_dir,
        skills_source=skills_source,
        skills=skills,
    )
    if task.workdir is not None and not task.workdir.startswith("/"):
        raise TaskError(f"workdir must be absolute, got {task.workdir!r}", file=toml_path,
                        field="environment.workdir")
    extra: dict[str, object] = {}
    for table in (top, meta, task_t, agent, verifier, envt, solution_t):
        known = {id(top): KNOWN_TOP, id(meta): KNOWN_META, id(agent): KNOWN_AGENT,
                 id(verifier): KNOWN_VERIFIER, id(task_t): {"name", "description", "authors"}}.get(id(table), set())
        for key, value in table.unknown(known).items():
            extra[key] = value
            warnings.append(f"{toml_path.name}: unknown key {key!r} kept, not used")
    if steps:  # the top-level view is step 0's (task-level tests with the step's over them)
        first = task.for_step(0)
        task = dataclasses.replace(task, tests_dir=first.tests_dir, extra_test_files=first.extra_test_files)
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

