"""Real environment builds (rollbank.tasks.builder): overlayfs + bubblewrap build sandbox.

Layers go to a per-test cache directory; the Debian base comes from the shared cache (built
once by :func:`rollbank.tasks.bases.ensure_base`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from rollbank.errors import BuildError
from rollbank.tasks.builder import BuiltEnvironment, EnvironmentBuilder
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.loader import load_task
from rollbank.tasks.model import Task

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def builder(tmp_path: Path) -> EnvironmentBuilder:
    return EnvironmentBuilder(BuilderConfig(cache_root=str(tmp_path / "layers")))


def find(built: BuiltEnvironment, rel: str) -> Path:
    """The topmost layer holding ``rel`` (what the overlay would show)."""
    for layer in reversed(built.layers):
        if (layer / rel).exists() or (layer / rel).is_symlink():
            return layer / rel
    raise AssertionError(f"{rel} is in no layer")


def task_with_dockerfile(tmp_path: Path, text: str, **changes: object) -> Task:
    src = FIXTURES / "tasks" / "harbor-dockerfile-features"
    dst = tmp_path / "task"
    shutil.copytree(src, dst)
    (dst / "environment" / "Dockerfile").write_text(text)
    return dataclasses.replace(load_task(dst), **changes)  # type: ignore[arg-type]


def no_temp_dirs(builder: EnvironmentBuilder) -> bool:
    return not [p for p in builder.root.iterdir() if p.name.startswith(".tmp-")]


def test_features_build_into_layers(builder: EnvironmentBuilder) -> None:
    task = load_task(FIXTURES / "tasks" / "harbor-dockerfile-features")
    built = builder.build(task)
    assert not built.cached and built.steps_built > 0
    assert built.workdir == "/srv/app"
    assert built.env["MODE"] == "test" and built.env["LEGACY_VAR"] == "legacy value"
    assert built.env["APP_HOME"] == "/srv/app" and built.env["TASK_ENV"] == "from-task-toml"
    assert "GREETING" not in built.env  # ARG values do not persist
    assert built.base_image == "python:3.12-slim"
    assert any("Python 3.12 requested" in a for a in built.approximations)
    assert any("CMD" in n for n in built.notes) and any("EXPOSE" in n for n in built.notes)
    assert find(built, "srv/app/greeting.txt").read_text() == "hello there from test\n"
    assert find(built, "srv/app/data/nested/b.txt").read_text() == "beta\n"
    assert find(built, "opt/bundle/inside.txt").read_text() == "from the archive\n"
    assert find(built, "usr/local/bin/run-app").stat().st_mode & 0o777 == 0o755
    assert find(built, "etc/app.conf").read_text() == "mode=test\n"
    assert find(built, "home/worker/me.txt").read_text() == "worker\n"
    assert find(built, "home/worker/a.txt").stat().st_uid == 1000  # COPY --chown=worker
    assert find(built, "srv/app/data/a.txt").stat().st_uid == 0  # COPY: root, whatever the host owner
    assert find(built, "var/lib/app/base.txt").read_text() == "python:3.12-slim\n"  # global ARG
    whiteout = find(built, "etc/debian_version").lstat()  # deleted by RUN: an overlay whiteout
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == 0
    assert built.layers[0].name.startswith("debian-bookworm-")
    assert len(built.layer_hashes) >= len(built.layers)


def test_second_build_is_cached_with_the_same_layers(builder: EnvironmentBuilder) -> None:
    task = load_task(FIXTURES / "tasks" / "harbor-dockerfile-features")
    first = builder.build(task)
    second = builder.build(task)
    assert second.cached and second.steps_built == 0
    assert (second.layers, second.layer_hashes) == (first.layers, first.layer_hashes)


def test_changing_a_copied_file_rebuilds_from_that_step_only(builder: EnvironmentBuilder,
                                                            tmp_path: Path) -> None:
    text = "FROM ubuntu:24.04\nRUN echo one > /one\nCOPY data/a.txt /a.txt\nRUN cat /a.txt > /copy\n"
    task = task_with_dockerfile(tmp_path, text)
    first = builder.build(task)
    (task.context_dir / "data" / "a.txt").write_text("changed\n")
    second = builder.build(task)
    assert second.layer_hashes[:2] == first.layer_hashes[:2]  # base + first RUN reused
    assert second.layer_hashes[2] != first.layer_hashes[2]
    assert second.steps_built == 2
    assert find(second, "copy").read_text() == "changed\n"


def test_failing_run_names_the_line_and_leaves_no_temp_dirs(builder: EnvironmentBuilder) -> None:
    task = load_task(FIXTURES / "tasks-malformed" / "failing-run")
    with pytest.raises(BuildError) as err:
        builder.build(task)
    assert err.value.line == 3 and err.value.file is not None
    assert err.value.file.endswith("failing-run/environment/Dockerfile")
    assert "exited with 3" in str(err.value)
    assert no_temp_dirs(builder)
    layers = [p for p in builder.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(layers) == 1  # only the complete layer of line 2


def test_build_timeout_is_enforced(builder: EnvironmentBuilder, tmp_path: Path) -> None:
    task = task_with_dockerfile(tmp_path, "FROM ubuntu:24.04\nRUN sleep 600\n", build_timeout_s=1.0)
    with pytest.raises(BuildError, match="timed out") as err:
        builder.build(task)
    assert err.value.line == 2
    assert no_temp_dirs(builder)


@pytest.mark.parametrize(
    ("name", "line", "text"),
    [
        ("multi-stage", 5, "no earlier stage named .nginx:latest."),
        ("add-url", 2, "URL"),
        ("unknown-flag", 2, "--parents"),
        ("unsupported-base", 1, "alpine"),
    ],
)
def test_unsupported_dockerfiles_name_the_line(builder: EnvironmentBuilder, name: str, line: int,
                                              text: str) -> None:
    with pytest.raises(BuildError, match=text) as err:
        builder.build(load_task(FIXTURES / "tasks-malformed" / name))
    assert err.value.line == line
    assert no_temp_dirs(builder)


def test_copy_through_a_symlink_out_of_the_context_is_refused(builder: EnvironmentBuilder,
                                                             tmp_path: Path) -> None:
    task = task_with_dockerfile(tmp_path, "FROM ubuntu:24.04\nCOPY data/ /data/\nCOPY link /x\n")
    (task.context_dir / "link").symlink_to("/etc/shadow")  # added after loading
    with pytest.raises(BuildError, match="escapes the build context") as err:
        builder.build(task)
    assert err.value.line == 3


def test_concurrent_builds_of_one_task_build_each_layer_once(builder: EnvironmentBuilder,
                                                            tmp_path: Path) -> None:
    task = task_with_dockerfile(tmp_path, "FROM ubuntu:24.04\nRUN echo a > /a\nRUN echo b > /b\n")
    results: list[BuiltEnvironment] = []
    errors: list[BaseException] = []

    def go() -> None:
        try:
            results.append(builder.build(task))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(r.steps_built for r in results) == 2
    assert len({r.layers for r in results}) == 1


def test_docker_image_without_dockerfile_uses_the_base(builder: EnvironmentBuilder,
                                                       tmp_path: Path) -> None:
    task = task_with_dockerfile(tmp_path, "FROM ubuntu:24.04\n")
    task = dataclasses.replace(task, dockerfile=None, docker_image="python:3.13", workdir="/work")
    built = builder.build(task)
    assert built.workdir == "/work" and built.base_image == "python:3.13"
    assert find(built, "work").is_dir()


def test_copied_files_belong_to_root_whatever_their_host_owner(builder: EnvironmentBuilder,
                                                               tmp_path: Path) -> None:
    task = task_with_dockerfile(tmp_path, "FROM ubuntu:24.04\nCOPY data/ /data/\nCOPY data/a.txt /etc/\n")
    for p in (task.context_dir / "data").rglob("*"):
        os.chown(p, 4321, 4321)
    built = builder.build(task)
    assert find(built, "data/nested/b.txt").stat().st_uid == 0
    assert find(built, "etc/a.txt").stat().st_uid == 0
    assert find(built, "etc/passwd").is_file()  # /etc is merged into, not replaced


def test_run_steps_get_dockers_capabilities_not_all_of_root(builder: EnvironmentBuilder,
                                                           tmp_path: Path) -> None:
    task = task_with_dockerfile(tmp_path, "FROM ubuntu:24.04\nRUN chown nobody /tmp && mount -t tmpfs none /mnt\n")
    with pytest.raises(BuildError, match="permission denied") as err:
        builder.build(task)
    assert err.value.line == 2


def test_temp_dirs_of_dead_builders_are_reaped(tmp_path: Path) -> None:
    root = tmp_path / "layers"
    dead = root / ".tmp-999999999-1"  # no such pid
    (dead / "upper").mkdir(parents=True)
    EnvironmentBuilder(BuilderConfig(cache_root=str(root)))
    assert not dead.exists()
