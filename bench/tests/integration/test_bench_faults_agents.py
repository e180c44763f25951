"""A tiny fault campaign of the agent kinds only (`rollbank bench faults --kinds <agent
kinds>`): the scripted agent program behind rollbank's real gateway, on accel-sim engines
behind the fault proxy, in real sandboxes with the real verifiers. Fails if any agent fault
is attributed against docs/agents.md's decision table (the program's crash, silence or
malformed requests, a first prompt over the context and the gateway's engine side are
infra; its hang past agent.timeout_s and a context it filled itself are the model's), a kind
was never injected, the ledger or a batch is off, a clean attempt is not trainable, or
anything leaked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.cli.main import main
from rollbank_bench.faults.kinds import AGENT_KINDS

pytestmark = pytest.mark.integration


def test_agent_fault_kinds_are_attributed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "faults", "--kinds", ",".join(k.value for k in AGENT_KINDS),
               "--faults", "10", "--rate", "1.0", "--groups", "2", "--group-size", "3",
               "--pool-groups", "3", "--batches-per-round", "1", "--max-rounds", "5",
               "--clean-tasks", "2", "--sandbox-slots", "6", "--out", str(tmp_path / "c")])
    report = json.loads(capsys.readouterr().out)
    kinds = {k: v for k, v in report["by_kind"].items() if v["injected"]}
    assert set(kinds) == {k.value for k in AGENT_KINDS}, report["by_kind"]
    assert report["rounds"] and all(r["agents"] for r in report["rounds"])
    assert report["faults_observed"] >= 20, report["not_observed"]
    assert report["attribution_rate"] == 1.0, report["misattributed"]
    assert all(v["correct"] == v["observed"] for v in kinds.values()), kinds
    assert report["ledger_batch_errors"] == [], report["ledger_batch_errors"]
    assert report["clean_attempts"]["attempts"] > 0
    assert report["clean_attempts"]["unexplained"] == 0, report["clean_attempts"]
    leaks = {k: v for k, v in report["leaks"].items() if not k.endswith("_examples")}
    assert not any(leaks.values()), report["leaks"]
    assert rc == 0 and report["ok"], report["checks"]
