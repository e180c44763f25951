"""The user's own tasks are not silently filtered out by the embedded default (issue 29, item
2): ``--tasks``/``--model`` replace the default's ``include``/``exclude_costs``, and every empty
selection names the filter that emptied it and how to undo it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.collect_config import load_collect_config
from rollbank.errors import ConfigError
from rollbank.service.config import load_service_config
from rollbank.task_selection import select_tasks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MINE = str(FIXTURES / "tasks" / "harbor-dockerfile-features")


def test_own_tasks_are_not_filtered_by_the_embedded_include() -> None:
    embedded = load_collect_config(None, {})
    assert embedded.include  # the default's tuned selection (a premise of this test)
    for load in (load_collect_config, load_service_config):
        cfg = load(None, {"tasks": [MINE]}, {"tasks": "--tasks"})
        assert cfg.include == [] and cfg.exclude_costs == []
        assert [t.task_id for t in select_tasks(cfg)] == ["harbor-dockerfile-features"]


def test_another_model_gets_the_whole_suite() -> None:
    cfg = load_collect_config(None, {"inference.managed.model": "smollm2-135m-instruct"})
    assert cfg.include == [] and cfg.exclude_costs == []


def test_a_selection_the_user_gives_is_kept(tmp_path: Path) -> None:
    cfg = load_collect_config(None, {"tasks": [MINE], "include": ["x"]})
    assert cfg.include == ["x"]
    f = tmp_path / "c.toml"
    f.write_text(f'tasks = ["{MINE}"]\ninclude = ["y"]\n')
    assert load_collect_config(f, {"tasks": [MINE]}).include == ["y"]  # a file says what it means


def test_an_empty_selection_names_its_filter_and_the_undo() -> None:
    cfg = load_collect_config(None, {"tasks": [MINE], "include": ["nope"]})
    with pytest.raises(ConfigError) as exc:
        select_tasks(cfg)
    msg = str(exc.value)
    assert exc.value.field == "include" and "nope" in msg and "harbor-dockerfile-features" in msg
    assert "include=[]" in msg
    cfg = load_collect_config(None, {"tasks": [MINE], "exclude_costs": ["cheap"]})
    with pytest.raises(ConfigError) as exc:
        select_tasks(cfg)
    assert exc.value.field == "exclude_costs" and "exclude_costs=[]" in str(exc.value)
