"""The fault campaign's agent kinds, pure parts: expectations, the scripted agent's plan per
attempt (once per seed, first run only, none on a verifier-fault task), the proxy's
per-session arming, the template's model folder (the campaign runs them on real parts:
bench/tests/integration/test_bench_faults_agents.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.agents.contract import LLM, AgentTask
from rollbank_bench.faults.agent_proxy import AgentFaultProxy
from rollbank_bench.faults.agents import (
    AgentFaults,
    parse_attempt,
    planned_for,
    session_of,
    write_model_folder,
)
from rollbank_bench.faults.inject import FaultLog
from rollbank_bench.faults.kinds import (
    AGENT_KINDS,
    EXPECT,
    GATEWAY_KINDS,
    PER_ATTEMPT,
    FaultKind,
    FaultSchedule,
    Via,
)


def _proxy(schedule: FaultSchedule, log: FaultLog, base_seed: int = 5) -> AgentFaultProxy:
    async def restart(i: int) -> tuple[str, int]:
        raise AssertionError("not in these tests")

    return AgentFaultProxy([("127.0.0.1", 1)], schedule, log, base_seed=base_seed,
                           restart=restart, kill=lambda i: None)


def test_agent_kinds_expectations_follow_the_agents_decision_table() -> None:
    assert set(AGENT_KINDS) == {k for k in FaultKind if EXPECT[k].via is Via.AGENT}
    assert not set(AGENT_KINDS) & set(PER_ATTEMPT)  # an agent round's schedule is its own
    model = {FaultKind.AGENT_HANG, FaultKind.AGENT_CONTEXT_EXHAUSTED}  # the model's own doing
    for k in AGENT_KINDS:
        assert EXPECT[k].outcomes == ({"model_failure"} if k in model else {"infra_failure"}), k
    assert set(GATEWAY_KINDS) <= set(AGENT_KINDS)


def test_the_agent_plans_each_seed_once_on_its_first_run_only() -> None:
    sched, log = FaultSchedule(11, 1.0, AGENT_KINDS), FaultLog()
    proxy = _proxy(sched, log)
    faults = AgentFaults(sched, log, proxy)
    kinds = set()
    for seq in range(30):
        for slot in range(2):
            retry = AgentTask("faults-ok-0", "x", "/app", f"g{seq:05d}/s{slot}/r1")
            seed, p = planned_for(faults, retry)  # a retry runs clean, and does not use the seed
            assert p is None and seed == proxy.seed_of(seq, slot)
            first = AgentTask("faults-ok-0", "x", "/app", f"g{seq:05d}/s{slot}/r0")
            seed, p = planned_for(faults, first)
            assert p is not None and p.kind in AGENT_KINDS
            kinds.add(p.kind)
            assert planned_for(faults, first) == (seed, None)  # once per seed
    assert kinds == set(AGENT_KINDS)  # every kind within a few groups
    on_verifier_task = AgentTask("faults-verifier-crash", "x", "/app", "g00099/s0/r0")
    assert planned_for(faults, on_verifier_task)[1] is None
    with pytest.raises(ValueError):
        planned_for(faults, AgentTask("t", "x", "/app", "not-an-attempt"))
    assert parse_attempt("g00012-abc/s3/r2") == (12, 3, 2)


def test_proxy_arms_a_session_and_maps_the_gateways_request_ids() -> None:
    sched, log = FaultSchedule(0, 0.0, AGENT_KINDS), FaultLog()
    proxy = _proxy(sched, log)
    body = json.dumps({"request_id": "gw-Sess_ion-3", "prompt": [1, 2]}).encode()
    assert proxy._fault_for(body) == (None, "gw-Sess_ion-3")
    proxy.arm("Sess_ion", FaultKind.GATEWAY_STREAM_CUT, 42, "g00001/s0/r0")
    assert proxy._fault_for(body) == (FaultKind.GATEWAY_STREAM_CUT, "gw-Sess_ion-3")
    other = json.dumps({"request_id": "gw-other-1"}).encode()
    assert proxy._fault_for(other) == (None, "gw-other-1")
    proxy.disarm("Sess_ion")
    assert proxy._fault_for(body) == (None, "gw-Sess_ion-3")
    with pytest.raises(ValueError):
        proxy.arm("s", FaultKind.AGENT_HANG, 1, "a")


def test_session_of_base_url_and_the_model_folder(tmp_path: Path) -> None:
    llm = LLM("http://127.0.0.1:9/s/AbC-12_x/v1", "k", "m")
    assert session_of(llm) == "AbC-12_x"
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text("{}")
    (tiny / "tokenizer.json").write_text("{}")
    (tiny / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    out = write_model_folder(tmp_path / "m", tiny)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "</s>" and "add_generation_prompt" in cfg["chat_template"]
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()


def test_by_via_sums_the_kinds() -> None:
    from rollbank_bench.faults.checks import Verdict, by_kind
    from rollbank_bench.faults.report import by_via

    vs = [Verdict(FaultKind.AGENT_HANG, "a", "model_failure", "budget_exhausted"),
          Verdict(FaultKind.GATEWAY_STREAM_CUT, "b", "infra_failure", "inference_error"),
          Verdict(FaultKind.GATEWAY_STREAM_CUT, "c", None, None),
          Verdict(FaultKind.HTTP_5XX, "d", "model_failure", "verified_fail")]
    got = by_via(by_kind(vs))
    assert got["agent"] == {"kinds": len(AGENT_KINDS), "injected": 3, "observed": 2, "correct": 2}
    assert got["engine"]["injected"] == 1 and got["engine"]["correct"] == 0
