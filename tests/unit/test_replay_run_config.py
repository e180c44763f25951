"""`rollbank replay` builds its harness from the run's own config.resolved.json (issue 25):
a replay of a non-default run parses the model's text with the run's harness settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.collect_config import load_collect_config
from rollbank.config import dump_resolved
from rollbank.episodes.episode_file import parse_episode
from rollbank.errors import ConfigError

EPISODE = {"schema": "rollbank.episode/1", "trajectory_id": "t0", "group_id": "g0",
           "task_id": "x", "task_path": "/nowhere", "task_hash": "h", "harness": "fenced-shell"}


def _run(tmp_path: Path, **overrides: object) -> Path:
    run = tmp_path / "run"
    dump_resolved(load_collect_config(None, dict(overrides)), run)
    (run / "episodes").mkdir()
    ep = run / "episodes" / "t0.json"
    ep.write_text(json.dumps(EPISODE))
    return ep


def test_replay_uses_the_runs_harness_settings(tmp_path: Path) -> None:
    from rollbank.cli.replay import harness_for, run_config

    ep = _run(tmp_path, **{"fenced_shell.max_tokens": 77, "fenced_shell.temperature": 0.3})
    config, source = run_config(ep, None)
    assert source.endswith("config.resolved.json")
    harness = harness_for(parse_episode(EPISODE, file=ep), config, ep)
    assert harness.config.max_tokens == 77 and harness.config.temperature == 0.3


def test_without_a_run_config_the_defaults_are_said(tmp_path: Path) -> None:
    from rollbank.cli.replay import run_config

    ep = tmp_path / "lone.json"
    ep.write_text(json.dumps(EPISODE))
    config, source = run_config(ep, None)
    assert source.startswith("defaults") and config.fenced_shell.max_tokens > 0


def test_a_broken_run_config_is_bad_input(tmp_path: Path) -> None:
    from rollbank.cli.replay import run_config

    ep = _run(tmp_path)
    (ep.parent.parent / "config.resolved.json").write_text('{"runner": {"step_timeout_s": -1}}')
    with pytest.raises(ConfigError) as exc:
        run_config(ep, None)
    assert "config.resolved.json" in str(exc.value) and exc.value.exit_code == 3
