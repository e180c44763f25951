"""Harbor schema 1.1 loading: multi-step tasks, artifacts, skills, MCP servers; `load_each`."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from rollbank.errors import TaskError
from rollbank.tasks.loader import LoadFailure, load_each, load_task
from rollbank.tasks.model import passes_min_reward

FIXTURES = Path(__file__).parents[1] / "fixtures"
REAL = FIXTURES / "harbor-real"


def copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(REAL / name, dst)
    return dst


def test_multi_step_task_loads_without_a_top_level_instruction() -> None:
    t = load_task(REAL / "multi-step-notes")
    assert not (t.path / "instruction.md").exists()
    assert t.multi_step and [s.name for s in t.steps] == ["01-create", "02-append"]
    assert t.schema_version == "1.1" and t.multi_step_reward_strategy == "mean"
    assert t.tags == ("multi-step", "files")  # [task] keywords
    assert t.artifacts == ("/app/notes.txt",)
    first, second = t.steps
    assert first.min_reward == 1.0 and second.min_reward is None
    assert (first.agent_timeout_s, first.verifier_timeout_s) == (60.0, 30.0)
    assert (second.agent_timeout_s, second.verifier_timeout_s) == (90.0, None)
    assert dict(first.verifier_env) == {"EXPECTED_LINES": "1"}
    assert second.artifacts == ("/app/notes.txt",)  # the table form's source
    assert first.tests_dir is None and second.tests_dir == t.path / "steps" / "02-append" / "tests"
    assert first.solution == t.path / "steps" / "01-create" / "solution" / "solve.sh"
    # the top-level view is step 0's
    assert t.instruction == first.instruction and t.solution == first.solution
    assert t.warnings == ()


def test_for_step_layers_the_step_tests_over_the_task_tests() -> None:
    t = load_task(REAL / "multi-step-notes")
    one, two = t.for_step(0), t.for_step(1)
    assert one.tests_dir == t.path / "tests" and one.extra_test_files == ()
    assert two.tests_dir == t.path / "tests"
    assert two.extra_test_files == (("test.sh", t.path / "steps" / "02-append" / "tests" / "test.sh"),)
    assert two.instruction.startswith("Append a second line")
    assert (two.agent_timeout_s, two.verifier_timeout_s) == (90.0, t.verifier_timeout_s)
    assert dict(two.verifier_env) == {"EXPECTED_LINES": "2"} and two.steps == ()
    assert two.artifacts == ("/app/notes.txt", "/app/notes.txt")


def test_min_reward_gate() -> None:
    assert passes_min_reward(None, None, {})
    assert passes_min_reward(1.0, 1.0, {}) and not passes_min_reward(1.0, 0.5, {})
    assert not passes_min_reward(0.5, None, {})
    assert passes_min_reward({"a": 0.5}, None, {"a": 0.7, "b": 0.0})
    assert not passes_min_reward({"a": 0.5, "c": 0.1}, None, {"a": 0.7})


@pytest.mark.parametrize(
    ("toml_tail", "field", "text"),
    [
        ('[[steps]]\nname = "nope"\n', "steps[0].name", "no folder"),
        ('[[steps]]\nname = "01-create"\n[[steps]]\nname = "01-create"\n', "steps[1].name", "duplicate"),
        ('[[steps]]\nname = "../x"\n', "steps[0].name", "letters"),
        ('[[steps]]\nname = "01-create"\nmin_reward = "high"\n', "steps[0].min_reward", "number"),
        ('[[steps]]\nname = "01-create"\nmin_reward = { a = true }\n', "steps[0].min_reward.a", "number"),
        # regression (fuzzing, #13): nan/inf were accepted (the step could never pass) and an
        # integer past a float's range crashed float() with an untyped OverflowError
        ('[[steps]]\nname = "01-create"\nmin_reward = nan\n', "steps[0].min_reward", "finite"),
        ('[[steps]]\nname = "01-create"\nmin_reward = { a = inf }\n', "steps[0].min_reward.a", "finite"),
        ('[[steps]]\nname = "01-create"\nmin_reward = 1' + "0" * 400 + '\n', "steps[0].min_reward", "finite"),
        ('[[steps]]\nname = "01-create\\n"\n', "steps[0].name", "letters"),
        ('[[steps]]\nname = "01-create"\nartifacts = [3]\n', "steps[0].artifacts[0]", "path"),
        ('steps = "x"\n', "steps", "array of tables"),
    ],
)
def test_bad_steps_name_the_field(tmp_path: Path, toml_tail: str, field: str, text: str) -> None:
    task = copy("multi-step-notes", tmp_path)
    head = (task / "task.toml").read_text().split("[[steps]]")[0]
    (task / "task.toml").write_text(toml_tail + "\n" + head if toml_tail.startswith("steps =") else head + toml_tail)
    with pytest.raises(TaskError, match=text) as err:
        load_task(task)
    assert err.value.field == field and err.value.file == str(task / "task.toml")


def test_a_step_without_any_test_sh_is_refused(tmp_path: Path) -> None:
    task = copy("multi-step-notes", tmp_path)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"01-create.*no test\.sh"):
        load_task(task)


def test_a_step_without_an_instruction_is_refused(tmp_path: Path) -> None:
    task = copy("multi-step-notes", tmp_path)
    (task / "steps" / "02-append" / "instruction.md").unlink()
    with pytest.raises(TaskError, match="required file is missing") as err:
        load_task(task)
    assert err.value.file == str(task / "steps" / "02-append" / "instruction.md")


def test_single_step_task_still_needs_its_instruction(tmp_path: Path) -> None:
    task = copy("skills-magic-word", tmp_path)
    (task / "instruction.md").unlink()
    with pytest.raises(TaskError, match="required file is missing"):
        load_task(task)


def test_skills_dir_and_the_skill_list() -> None:
    t = load_task(REAL / "skills-magic-word")
    assert t.skills_dir == "/skills"
    assert t.skills_source == t.path / "environment" / "skills"
    assert t.skills == (("house-style", "How reports are signed in this house."),)


def test_relative_skills_dir_is_refused(tmp_path: Path) -> None:
    task = copy("skills-magic-word", tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('skills_dir = "/skills"', 'skills_dir = "skills"'))
    with pytest.raises(TaskError, match="absolute") as err:
        load_task(task)
    assert err.value.field == "environment.skills_dir"


@pytest.mark.parametrize(
    ("snippet", "field"),
    [
        ('[[environment.mcp_servers]]\nname = "files"\ntransport = "sse"\nurl = "http://mcp:8000/sse"\n',
         "environment.mcp_servers"),
        ('mcp_servers = [{ name = "x", command = "npx" }]\n', "mcp_servers"),
    ],
)
def test_mcp_servers_are_a_clear_unsupported_error(tmp_path: Path, snippet: str, field: str) -> None:
    task = copy("skills-magic-word", tmp_path)
    toml = task / "task.toml"
    text = toml.read_text()
    toml.write_text(snippet + text if not snippet.startswith("[[") else text + "\n" + snippet)
    with pytest.raises(TaskError, match="MCP servers are not supported") as err:
        load_task(task)
    assert err.value.field == field and err.value.file == str(toml)


def test_load_each_reports_every_failure_and_goes_on(tmp_path: Path) -> None:
    bad = copy("multi-step-notes", tmp_path)
    (bad / "tests" / "test.sh").unlink()
    entries = load_each([REAL / "slim-pinned-apt", bad, tmp_path / "missing", REAL / "go-reverse-words",
                         REAL / "go-reverse-words"])
    kinds = [type(e).__name__ for e in entries]
    assert kinds == ["Task", "LoadFailure", "LoadFailure", "Task", "LoadFailure"]
    failures = [e for e in entries if isinstance(e, LoadFailure)]
    assert "no test.sh" in str(failures[0].error)
    assert "no such task folder" in str(failures[1].error)
    assert "duplicate task id" in str(failures[2].error)


def test_trial_reward_mean_final_and_unrun_steps() -> None:
    from rollbank.episodes.validate_steps import StepsOutcome
    from rollbank.episodes.verifier import VerifierResult, VerifierStatus

    t = load_task(REAL / "multi-step-notes")
    stopped = StepsOutcome(results=[("01-create", VerifierResult(VerifierStatus.FAIL, 0.5))])
    assert stopped.trial_reward(t) == 0.25  # the unrun step counts 0
    both = StepsOutcome(results=[("01-create", VerifierResult(VerifierStatus.PASS, 1.0)),
                                 ("02-append", VerifierResult(VerifierStatus.FAIL, 0.0))])
    assert both.trial_reward(t) == 0.5
    final = dataclasses.replace(t, multi_step_reward_strategy="final")
    assert both.trial_reward(final) == 0.0
    setup_only = dataclasses.replace(t, steps=(dataclasses.replace(t.steps[0], contributes_to_mean=False),
                                               t.steps[1]))
    assert both.trial_reward(setup_only) == 0.0


def test_unknown_strategy_is_refused(tmp_path: Path) -> None:
    task = copy("multi-step-notes", tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('"mean"', '"best"', 1))
    with pytest.raises(TaskError, match="one of") as err:
        load_task(task)
    assert err.value.field == "multi_step_reward_strategy"

