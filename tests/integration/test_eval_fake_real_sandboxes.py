"""`rollbank eval --inference.kind fake` end to end (real sandboxes), then `tasks health`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.cli.main import main
from rollbank.collect_config import load_collect_config
from rollbank.task_selection import select_tasks

pytestmark = pytest.mark.integration


def test_eval_cli_with_fake_inference_then_health(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    code = main(["eval", "--inference.kind", "fake", "--attempts", "3", "--k", "1", "3",
                 "--set", 'include=["hello-greeting","count-lines"]', "--metrics.live", "off",
                 "--metrics.report", "false", "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "eval.json").read_text())
    (row,) = doc["rows"]
    assert row["attempts"] == 6 and row["launched"] == 6 and row["tasks"] == 2
    assert {t: d["n"] for t, d in row["per_task"].items()} == {"count-lines": 3, "hello-greeting": 3}
    assert sum(row["outcomes"].values()) == 6
    assert row["ttft_s"]["source"] == "server_per_request" and row["ttft_s"]["p50"] is not None
    assert row["sandbox_s"] > 0 and row["requests"] >= 6
    captured = capsys.readouterr()
    assert "pass@3" in captured.out and '"rows"' in captured.out
    assert "eval result written to" in captured.err and "batch 0 written" not in captured.err
    assert "2 task(s) x 3 attempts" in captured.err and "set-up " in captured.err
    assert not list(out.rglob("batches"))  # an eval result, not a training batch
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {x["task"]: x["solve_rate"] for x in lines} == {
        t: d["successes"] / 3 for t, d in row["per_task"].items()}

    health_file = tmp_path / "health.json"
    assert main(["tasks", "health", str(out), "--min-attempts", "3", "--out", str(health_file),
                 "--json"]) == 0
    health = json.loads(health_file.read_text())
    assert health["groups"] == 2
    for task, d in row["per_task"].items():
        assert health["tasks"][task]["attempts"] == 3
        assert health["tasks"][task]["successes"] == d["successes"]
    # rotate the saturated ones out: pretend the default's first task was always solved
    first, *rest = load_collect_config(None, {}).include
    health_file.write_text(json.dumps({**health, "saturated": [first]}))
    cfg = load_collect_config(None, {"exclude_saturated_from": str(health_file)})
    ids = {t.task_id for t in select_tasks(cfg)}
    assert first not in ids and ids == set(rest) and rest
