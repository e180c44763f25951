"""Task-set health (pure aggregation), the probe report's verdict, exclude_saturated_from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.collect_config import load_collect_config
from rollbank.episodes.probes import CHEATS, ProbeReport, ProbeRun
from rollbank.errors import ConfigError, InputError
from rollbank.evaluation.health import SourceCounts, from_eval, health, load_sources
from rollbank.task_selection import select_tasks


def test_health_rates_flags_and_zero_variance() -> None:
    a = SourceCounts("batches")
    a.add_group("easy", [True, True, True, True])  # zero variance
    a.add_group("mid", [True, False, False, False])
    a.add_group("hard", [False, False])  # zero variance
    b = from_eval({"rows": [{"model": "m", "per_task": {
        "easy": {"n": 4, "successes": 4}, "mid": {"n": 4, "successes": 0},
        "hard": {"n": 4, "successes": 0}, "rare": {"n": 2, "successes": 0}}}]}, "eval")
    doc = health([a, *b], min_attempts=4)
    t = doc["tasks"]
    assert t["easy"]["solve_rate"] == 1.0 and t["easy"]["flag"] == "saturated"
    assert t["mid"]["successes"] == 1 and t["mid"]["attempts"] == 8 and t["mid"]["flag"] is None
    assert t["mid"]["by_source"]["eval:m"] == {"attempts": 4, "successes": 0, "solve_rate": 0.0}
    assert t["hard"]["flag"] == "never_solved"
    assert t["rare"]["flag"] is None  # 2 attempts < min_attempts
    assert doc["saturated"] == ["easy"] and doc["never_solved"] == ["hard"]
    assert doc["groups"] == 7 and doc["zero_variance_groups"] == 6  # eval: easy, mid, hard, rare


def test_load_sources_reads_eval_json_and_refuses_empty_folders(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "eval.json").write_text(json.dumps(
        {"rows": [{"model": "x", "per_task": {"t": {"n": 2, "successes": 1}}}]}))
    (src,) = load_sources([tmp_path / "e"])
    assert src.tasks == {"t": [2, 1]} and src.zero_variance_groups == 0
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError):
        load_sources([tmp_path / "empty"])


def test_exclude_saturated_from_rotates_tasks_out(tmp_path: Path) -> None:
    f = tmp_path / "health.json"
    first, *rest = load_collect_config(None, {}).include
    f.write_text(json.dumps({"saturated": [first]}))
    cfg = load_collect_config(None, {"exclude_saturated_from": str(f)})
    ids = {t.task_id for t in select_tasks(cfg)}
    assert first not in ids and ids == set(rest) and rest
    f.write_text(json.dumps({"saturated": list(load_collect_config(None, {}).include)}))
    with pytest.raises(ConfigError):
        select_tasks(cfg)
    f.write_text("{}")
    with pytest.raises(InputError):
        select_tasks(cfg)


def test_probe_report_verdict() -> None:
    rep = ProbeReport("t", oracle=ProbeRun("oracle", "pass", 1.0),
                      cheats=[ProbeRun("write_reward", "fail", 0.0, active=True)])
    assert rep.ok and rep.loopholes == []
    rep.cheats.append(ProbeRun("trojan_test_runner", "pass", 1.0))
    assert not rep.ok and rep.loopholes == ["trojan_test_runner"]
    assert not ProbeReport("t", oracle=ProbeRun("oracle", "fail", 0.0)).ok
    assert not ProbeReport("t", skipped="multi-step").ok
    d = rep.to_dict()
    assert d["loopholes"] == ["trojan_test_runner"] and d["ok"] is False


def test_cheat_scripts_name_the_outputs() -> None:
    by = {c.name: c for c in CHEATS}
    s = by["placeholder_outputs"].render(["/app/out file.txt"], "/app")
    assert "'/app/out file.txt'" in s and "placeholder" in s
    assert "reward.txt" in by["write_reward"].render([], "/app")
    assert len({c.render(["/a"], "/app") for c in CHEATS}) == len(CHEATS)
