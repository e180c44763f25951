"""Task loaders (Harbor, Terminal-Bench 1) and their validation errors, on real fixture folders."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rollbank.errors import TaskError
from rollbank.tasks.config import LoaderConfig
from rollbank.tasks.loader import load_task, load_tasks, resolve_paths
from rollbank.tasks.model import TaskFormat

FIXTURES = Path(__file__).parents[1] / "fixtures"
GOOD = FIXTURES / "tasks"
BAD = FIXTURES / "tasks-malformed"


def copy(name: str, tmp_path: Path, root: Path = GOOD) -> Path:
    dst = tmp_path / name
    shutil.copytree(root / name, dst, symlinks=True)
    return dst


def test_harbor_fields() -> None:
    t = load_task(GOOD / "harbor-dockerfile-features")
    assert t.format is TaskFormat.HARBOR
    assert t.task_id == "harbor-dockerfile-features"
    assert t.instruction.startswith("Write the word `ready`")
    assert t.agent_timeout_s == 300.0 and t.verifier_timeout_s == 300.0 and t.build_timeout_s == 300.0
    assert (t.cpus, t.memory_mb, t.storage_mb, t.allow_internet) == (1.0, 1024, 2048, False)
    assert t.env == {"TASK_ENV": "from-task-toml"}
    assert t.verifier_env == {"EXPECTED_WORD": "ready"}
    assert (t.difficulty, t.category, t.tags, t.cost) == ("easy", "fixtures", ("dockerfile", "fixture"), "cheap")
    assert t.dockerfile == t.path / "environment" / "Dockerfile"
    assert t.context_dir == t.path / "environment"
    assert t.tests_dir == t.path / "tests" and t.test_command == "bash /tests/test.sh"
    assert t.solution == t.path / "solution" / "solve.sh"
    assert len(t.content_hash) == 64


def test_unknown_toml_keys_are_kept_with_a_warning() -> None:
    t = load_task(GOOD / "harbor-dockerfile-features")
    assert t.extra == {"metadata.custom_field": "kept"}
    assert any("custom_field" in w for w in t.warnings)


def test_tbench_fields_and_run_tests() -> None:
    t = load_task(GOOD / "tbench-count-words")
    assert t.format is TaskFormat.TERMINAL_BENCH_1
    assert t.agent_timeout_s == 300.0 and t.verifier_timeout_s == 300.0
    assert t.context_dir == t.path and t.dockerfile == t.path / "Dockerfile"
    assert t.extra_test_files == (("run-tests.sh", t.path / "run-tests.sh"),)
    assert t.test_command == "rollbank-tb1-verify bash /tests/run-tests.sh"
    assert t.verifier_env == {"TEST_DIR": "/tests"}
    assert t.solution == t.path / "solution.sh"
    assert t.tags == ("text", "wc") and t.category == "file-operations"
    assert any("docker-compose" in w for w in t.warnings)


def test_tbench_descriptions_form_and_solution_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLBANK_CACHE", str(tmp_path / "cache"))
    t = load_task(GOOD / "tbench-yaml-solution")
    assert t.instruction.startswith("Create the directory /app/out")
    assert t.test_command == "rollbank-tb1-verify python3 -m pytest /tests/test_outputs.py -rA"
    assert t.agent_timeout_s == 360.0  # TB1 default
    assert t.verifier_timeout_s == 300.0
    assert t.solution is not None and t.solution.is_relative_to(tmp_path / "cache")
    assert t.solution.read_text().splitlines()[2:] == ["mkdir -p /app/out", "touch /app/out/ok"]


def test_folder_of_tasks_and_builtin_suite_name() -> None:
    tasks = load_tasks([GOOD])
    assert [t.task_id for t in tasks] == sorted(p.name for p in GOOD.iterdir() if p.is_dir())
    suite = resolve_paths(["terminal-lite"])
    assert suite and all(p.parent.name == "terminal-lite" for p in suite)


def test_content_hash_changes_with_any_file(tmp_path: Path) -> None:
    task = copy("harbor-dockerfile-features", tmp_path)
    before = load_task(task).content_hash
    assert load_task(task).content_hash == before
    (task / "environment" / "data" / "a.txt").write_text("changed\n")
    assert load_task(task).content_hash != before


def test_duplicate_task_ids_are_refused(tmp_path: Path) -> None:
    a = copy("harbor-dockerfile-features", tmp_path / "a")
    b = copy("harbor-dockerfile-features", tmp_path / "b")
    with pytest.raises(TaskError, match="duplicate task id"):
        load_tasks([a, b])


@pytest.mark.parametrize(
    ("name", "file", "field", "line", "text"),
    [
        ("bad-toml", "task.toml", None, None, "invalid TOML"),
        ("wrong-type", "task.toml", "agent.timeout_sec", None, "expected a number"),
        ("wrong-type-env", "task.toml", "environment.memory_mb", None, "expected an integer"),
        ("missing-instruction", "instruction.md", None, None, "missing"),
        ("missing-test-sh", "tests/test.sh", None, None, "missing"),
        ("copy-escape", "environment/Dockerfile", None, 3, "escapes the build context"),
        ("unknown-instruction", "environment/Dockerfile", None, 3, "FROBNICATE"),
        ("tb-bad-yaml", "task.yaml", None, 3, "invalid YAML"),
        ("tb-missing-instruction", "task.yaml", "instruction", None, "required field"),
        ("tb-wrong-type", "task.yaml", "max_agent_timeout_sec", None, "expected a number"),
    ],
)
def test_malformed_tasks_name_file_and_field(name: str, file: str, field: str | None,
                                             line: int | None, text: str) -> None:
    with pytest.raises(TaskError) as err:
        load_task(BAD / name)
    e = err.value
    assert e.file is not None and e.file.endswith(f"{name}/{file}")
    assert e.field == field
    assert e.line == line
    assert text in str(e)


def test_symlink_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    task = copy("harbor-dockerfile-features", tmp_path)
    (task / "environment" / "data" / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(TaskError, match="escapes the task folder") as err:
        load_task(task)
    assert err.value.file == str(task.resolve() / "environment" / "data" / "passwd")


def test_symlink_inside_the_folder_is_fine(tmp_path: Path) -> None:
    task = copy("harbor-dockerfile-features", tmp_path)
    (task / "environment" / "data" / "alias.txt").symlink_to("a.txt")
    assert load_task(task).task_id == "harbor-dockerfile-features"


def test_dangling_symlink_is_refused(tmp_path: Path) -> None:
    task = copy("harbor-dockerfile-features", tmp_path)
    (task / "tests" / "gone").symlink_to("does-not-exist")
    with pytest.raises(TaskError, match="does not resolve"):
        load_task(task)


def test_huge_file_is_refused(tmp_path: Path) -> None:
    task = copy("harbor-dockerfile-features", tmp_path)
    big = task / "environment" / "big.bin"
    with big.open("wb") as f:
        f.truncate(2 * 1024 * 1024)  # sparse: 2 MiB without writing them
    with pytest.raises(TaskError, match="over the 1 MiB limit") as err:
        load_task(task, LoaderConfig(max_file_mb=1))
    assert err.value.file == str(big.resolve())


def test_fifo_is_refused(tmp_path: Path) -> None:
    task = copy("harbor-dockerfile-features", tmp_path)
    os.mkfifo(task / "tests" / "pipe")
    with pytest.raises(TaskError, match="not a regular file"):
        load_task(task)


def test_not_a_task_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="contains no task folders"):
        load_tasks([tmp_path / "empty"])
    with pytest.raises(TaskError, match="no such task folder"):
        load_tasks([tmp_path / "missing"])
