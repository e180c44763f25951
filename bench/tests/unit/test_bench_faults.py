"""The fault campaign's pure parts: schedule, scripted policy, request ids, proxy head
rewrite, verdicts and the batch / ledger checks (the campaign itself runs on real parts:
tests/integration/test_bench_faults.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollbank.batching.advantages import grpo_advantages
from rollbank.batching.batch import GroupResult
from rollbank.batching.config import AdvantageConfig
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.policy.scheduler import attempt_seed
from rollbank_bench.faults.checks import by_kind, check_group, check_ledger, verdict
from rollbank_bench.faults.inject import FaultLog, fill
from rollbank_bench.faults.kinds import (
    ENGINE_KINDS,
    EXPECT,
    KNOWN_LIMITS,
    MODEL_KINDS,
    PER_ATTEMPT,
    SANDBOX_KINDS,
    FaultKind,
    FaultSchedule,
)
from rollbank_bench.faults.proxy import close_head, parse_rid, read_request
from rollbank_bench.faults.script import MARKER, MODEL_COMMANDS, ScriptedWorkload
from rollbank_bench.faults.tasks import task_id_kind, write_tasks


def test_every_kind_has_an_expectation() -> None:
    assert set(EXPECT) == set(FaultKind)
    assert EXPECT[FaultKind.SLOW_RESPONSE].outcomes == {"model_success", "model_failure"}
    # the model's own doing is never infra (OOM / pids: the episode goes on, the verifier decides)
    assert all(EXPECT[k].outcomes <= {"model_success", "model_failure"} for k in MODEL_KINDS)
    assert EXPECT[FaultKind.MODEL_TIMEOUT].outcomes == {"model_failure"}
    assert all(EXPECT[k].outcomes == {"infra_failure"} for k in SANDBOX_KINDS + ENGINE_KINDS
               if k not in (FaultKind.SLOW_RESPONSE, FaultKind.DISK_FULL))
    # a host-filled layer: a failure under it is infra (the disk experiment); a pass verified
    # on the model's state stands. Never a model failure, and no longer a known limit.
    assert EXPECT[FaultKind.DISK_FULL].outcomes == {"infra_failure", "model_success"}
    assert not any(k is FaultKind.DISK_FULL for k, _ in KNOWN_LIMITS)


def test_schedule_is_seeded_rotates_kinds_and_respects_exemptions() -> None:
    a, b = FaultSchedule(7, 0.5), FaultSchedule(7, 0.5)
    seeds = [attempt_seed(7, seq, slot) for seq in range(60) for slot in range(4)]
    assert [a.planned(s) for s in seeds] == [b.planned(s) for s in seeds]
    got = [p for p in (a.planned(s) for s in seeds) if p is not None]
    assert 0.35 < len(got) / len(seeds) < 0.65
    assert {p.kind for p in got} == set(PER_ATTEMPT)
    assert all(0 <= p.turn < 2 and 0.2 <= p.delay_s <= 1.0 for p in got)
    first = next(s for s in seeds if a.planned(s) is not None)
    a.exempt.add(first)
    assert a.planned(first) is None
    assert FaultSchedule(7, 0.0).planned(first) is None
    with pytest.raises(ValueError):
        FaultSchedule(0, 1.5)


def test_scripted_policy_carries_the_attempts_fault() -> None:
    sched = FaultSchedule(3, 1.0)
    wl = ScriptedWorkload(sched)
    seeds = [attempt_seed(3, seq, slot) for seq in range(40) for slot in range(4)]
    for s in seeds:
        p = sched.planned(s)
        assert p is not None
        cmds = [t.command().text for t in wl.plan("faults-ok-0", s).turns]
        assert len(cmds) == 2
        if p.kind in MODEL_KINDS:
            assert cmds[p.turn] == MODEL_COMMANDS[p.kind]
        elif p.kind in SANDBOX_KINDS:
            assert cmds[p.turn].startswith(f"echo {s} > {MARKER}")
        else:
            assert not any(MARKER in c for c in cmds)
        assert wl.plan("faults-ok-0", s).action(1).done
    # an attempt on a verifier-fault task gets no other fault
    s = seeds[0]
    assert task_id_kind("faults-verifier-hang") is FaultKind.VERIFIER_HANG
    wl.plan("faults-verifier-hang", s)
    assert sched.planned(s) is None


def test_tasks_are_written_with_their_fault(tmp_path: Path) -> None:
    from rollbank.tasks.loader import load_tasks

    write_tasks(tmp_path, clean=2, verifier_faults=True)
    ids = sorted(t.task_id for t in load_tasks([str(tmp_path)]))
    assert ids == ["faults-ok-0", "faults-ok-1", "faults-verifier-crash", "faults-verifier-hang",
                   "faults-verifier-no-reward"]
    assert [task_id_kind(i) for i in ids].count(None) == 2


def test_request_ids_map_to_attempts() -> None:
    assert parse_rid("g00012/s3/r0/t1") == (12, 3, 0, 1)
    assert parse_rid("g00012-q1/s0/r2/t0") == (12, 0, 2, 0)
    assert parse_rid("calibrate-0") is None


def test_proxy_reads_requests_and_closes_connections() -> None:
    async def go() -> tuple[bytes, bytes] | None:
        r = asyncio.StreamReader()
        r.feed_data(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nConnection: keep-alive"
                    b"\r\n\r\nabcdGET")
        r.feed_eof()
        return await read_request(r)

    got = asyncio.run(go())
    assert got is not None
    head, body = got
    assert body == b"abcd"
    out = close_head(head)
    assert b"keep-alive" not in out and out.endswith(b"Connection: close\r\n\r\n")


def test_fill_stops_at_enospc(tmp_path: Path) -> None:
    dev_full = Path("/dev/full")  # every write fails with ENOSPC
    if not dev_full.exists():
        pytest.skip("no /dev/full")
    assert fill(dev_full) == 0


def test_fault_log_injects_a_seed_once() -> None:
    log = FaultLog()
    assert log.first(5) and not log.first(5) and log.first(6)


def _traj(i: int, reason: Reason, reward: float | None) -> Trajectory:
    t = Trajectory(trajectory_id=f"g0/s{i}/r0", group_id="g0", task_id="t", attempt=i)
    t.outcome = EpisodeOutcome.of(reason, reward=reward)
    return t


def test_verdicts_by_kind() -> None:
    ok = verdict(FaultKind.HTTP_5XX, _traj(0, Reason.INFERENCE_ERROR, None))
    bad = verdict(FaultKind.MODEL_OOM, _traj(1, Reason.HOST_STALLED, None))
    lost = verdict(FaultKind.CONN_RESET, None, attempt_id="g0/s2/r0")
    assert ok.correct and not bad.correct and not lost.observed
    kinds = by_kind([ok, bad, lost])
    assert kinds["http_5xx"] == {"injected": 1, "observed": 1, "confounded": 0, "correct": 1,
                                 "expected": ["infra_failure"],
                                 "reasons": {"infra_failure/inference_error": 1}}
    assert kinds["model_oom"]["correct"] == 0 and kinds["conn_reset"]["observed"] == 0


def _group(trajs: list[Trajectory], advantages: tuple[float, ...] | None = None,
           infra_final: int = 0) -> GroupResult:
    cfg = AdvantageConfig()
    rewards = tuple(float(t.outcome.reward or 0.0) for t in trajs if t.outcome is not None)
    adv = grpo_advantages(list(rewards), cfg).advantages if advantages is None else advantages
    return GroupResult("g0", "t", 0, tuple(trajs), rewards, adv, False, len(trajs) + infra_final,
                       infra_final, 0, 0.0, 1.0)


def test_group_check_finds_bad_groups() -> None:
    cfg = AdvantageConfig()
    good = [_traj(0, Reason.VERIFIED_PASS, 1.0), _traj(1, Reason.VERIFIED_FAIL, 0.0)]
    assert check_group(_group(good), cfg, 2) == []
    assert any("advantages" in e for e in check_group(_group(good, (0.5, -0.5)), cfg, 2))
    infra = [*good, _traj(2, Reason.SANDBOX_DIED, None)]
    assert any("non-trainable" in e for e in check_group(_group(infra), cfg, 2))
    assert any("min_valid" in e for e in check_group(_group(good[:1], infra_final=1), cfg, 2))
    twice = [good[0], _traj(0, Reason.VERIFIED_FAIL, 0.0)]
    assert any("slot twice" in e for e in check_group(_group(twice), cfg, 2))


def test_ledger_check() -> None:
    ledger = {"launched": 3, "consumed": 1, "retried": 1, "waste": 1, "in_flight": 0}
    trajs = [_traj(i, Reason.VERIFIED_PASS, 1.0) for i in range(3)]
    assert check_ledger(ledger, trajs, 3) == []
    assert check_ledger({**ledger, "waste": 0}, trajs, 3)
    assert check_ledger(ledger, trajs, 4)
    assert check_ledger(ledger, [*trajs, trajs[0]], 3)


def test_an_attempt_hit_by_engine_collateral_is_confounded_not_judged() -> None:
    from rollbank_bench.faults.checks import confounder

    t = _traj(0, Reason.INFERENCE_ERROR, None)
    assert confounder(t, {t.trajectory_id}) is not None
    assert confounder(t, set()) is None
    t.outcome = EpisodeOutcome.of(Reason.INFERENCE_ERROR, error="POST /x: cannot connect: refused")
    assert confounder(t, set()) is not None
    assert confounder(_traj(1, Reason.HOST_STALLED, None), {"g0/s1/r0"}) is None
    # regression (second full run): a slow response whose delayed request met an engine
    # killed for another attempt was judged as the slow response's inference error
    from rollbank_bench.faults.checks import may_be_confounded

    assert may_be_confounded(FaultKind.SLOW_RESPONSE) and may_be_confounded(FaultKind.MODEL_OOM)
    assert not may_be_confounded(FaultKind.HTTP_5XX)
    v = verdict(FaultKind.MODEL_TIMEOUT, t)
    v.confounded = confounder(t, set())
    assert not v.observed and by_kind([v])["model_timeout"]["confounded"] == 1



def test_a_connection_lost_while_its_servers_port_was_down_is_confounded() -> None:
    # regression (s9 30-minute soak, the one misattribution in 1972): a model timeout's
    # attempt ended infra_failure/inference_error with "connection lost" (its request reset
    # in the closing listener's backlog when another attempt took the port down, so the
    # proxy never saw it and the client never said "cannot connect"); judged as the model
    # timeout's outcome. The port-down window on its server decides, not the message.
    from rollbank.episodes.spans import Span, add_span
    from rollbank_bench.faults.checks import confounder

    t = _traj(0, Reason.INFERENCE_ERROR, None)
    t.outcome = EpisodeOutcome.of(Reason.INFERENCE_ERROR, turn=2, server="http://127.0.0.1:9",
                                  error="ServerUnreachableError: POST /v1/completions: "
                                  "connection lost: RemoteProtocolError('Server disconnected')")
    add_span(t, Span("inference", 100.0, 101.0, t.trajectory_id, server="http://127.0.0.1:9"))
    add_span(t, Span("exec", 101.0, 104.0, t.trajectory_id))  # then the failing request
    add_span(t, Span("episode", 99.0, 105.5, t.trajectory_id))
    assert confounder(t, set()) is None  # no window known: judged
    down = [("http://127.0.0.1:9", 104.2, 106.2)]
    assert confounder(t, set(), down) == "server port down for another attempt"
    assert confounder(t, set(), [("http://127.0.0.1:8", 104.2, 106.2)]) is None  # other server
    assert confounder(t, set(), [("http://127.0.0.1:9", 90.0, 103.9)]) is None  # over before
    assert confounder(t, set(), [("http://127.0.0.1:9", 105.0, float("inf"))]) is not None
    wrong = _traj(1, Reason.STEP_TIMEOUT, None)  # a model's own ending is never confounded
    add_span(wrong, Span("episode", 99.0, 105.5, wrong.trajectory_id))
    assert confounder(wrong, set(), down) is None

def test_a_sandbox_fault_joins_the_run_it_landed_on() -> None:
    # regression (full campaign run): joined to the slot's first run, so a fault that landed
    # on the retry (the first run died earlier of a port down) was judged on the wrong run
    from rollbank.episodes.spans import Span, add_span
    from rollbank_bench.faults.verdicts import _run_in

    r0, r1 = _traj(0, Reason.INFERENCE_ERROR, None), _traj(0, Reason.SANDBOX_DIED, None)
    r1.retry, r1.trajectory_id = 1, "g0/s0/r1"
    for t, sb in ((r0, "sbA"), (r1, "sbB")):
        t.seed = 11
        add_span(t, Span("episode", 0.0, 1.0, t.trajectory_id, sandbox=sb))
    assert _run_in([r0, r1], 11, "sbB") is r1
    assert _run_in([r0, r1], 11, "sbC") is None


def test_kinds_flag_selects_kinds_and_names_a_wrong_one() -> None:
    import argparse

    from rollbank_bench.faults import parse_kinds
    from rollbank_bench.faults.kinds import FaultKind, selected

    got = parse_kinds("model_oom, sandbox_freeze")
    assert got == (FaultKind.MODEL_OOM, FaultKind.SANDBOX_FREEZE)
    assert selected(got) == (FaultKind.SANDBOX_FREEZE, FaultKind.MODEL_OOM)  # EXPECT order
    assert len(selected(None)) == len(FaultKind)
    with pytest.raises(argparse.ArgumentTypeError, match="model_boom"):
        parse_kinds("model_boom")


async def test_a_sandbox_gone_before_its_fault_landed_is_a_miss_not_an_injector_error() -> None:
    """The soak's two `disk_full: FileNotFoundError` injector errors: the attempt finished
    (its sandbox closed) during the fault's delay. Nothing was injected, so nothing is logged;
    the same failure on a live sandbox is still an injector error."""
    from types import SimpleNamespace

    from rollbank_bench.faults.inject import FaultingSource
    from rollbank_bench.faults.kinds import FaultKind

    no_such_pid = 1 << 22 | 1  # above the kernel's largest pid_max: /proc/<pid> never exists
    for alive, missed, errors in ((False, ["disk_full"], 0), (True, [], 1)):
        log = FaultLog()
        src = FaultingSource(None, None, log)  # type: ignore[arg-type]
        sb = SimpleNamespace(alive=alive, anchor_pid=no_such_pid, sandbox_id="b1")
        await src.land(sb, FaultKind.DISK_FULL, 7)  # type: ignore[arg-type]
        assert (src.missed, len(src.errors), log.items) == (missed, errors, [])


async def test_the_proxy_keeps_each_port_down_window_on_the_collectors_clock() -> None:
    import asyncio
    import time

    from rollbank_bench.faults.inject import FaultLog
    from rollbank_bench.faults.kinds import FaultSchedule
    from rollbank_bench.faults.proxy import DOWN_S, FaultProxy

    async def restart(i: int) -> tuple[str, int]:
        raise AssertionError("no engine is restarted here")

    proxy = FaultProxy([("127.0.0.1", 9)], FaultSchedule(0, 0.0), FaultLog(), base_seed=0,
                       restart=restart, kill=lambda i: None)
    async with proxy:
        url = proxy.urls[0]
        t0 = time.monotonic()
        down = asyncio.ensure_future(proxy._down(0))
        await asyncio.sleep(0.1)
        [(u, start, end)] = proxy.down_intervals()  # still down: open-ended
        assert u == url and t0 <= start <= time.monotonic() and end == float("inf")
        await down
        [(u, start, end)] = proxy.down_intervals()
        assert u == url and end - start >= DOWN_S and end <= time.monotonic()
        assert proxy.urls[0] == url  # the same port again


def test_a_misattribution_keeps_its_infra_evidence() -> None:
    import argparse

    from rollbank_bench.faults.report import summarize as summarize_campaign

    t = _traj(0, Reason.INFERENCE_ERROR, None)
    t.outcome = EpisodeOutcome.of(Reason.INFERENCE_ERROR, turn=1, server="http://s",
                                  error="connection lost" + "x" * 500)
    v = verdict(FaultKind.MODEL_TIMEOUT, t)
    assert v.evidence == {"error": ("connection lost" + "x" * 500)[:300], "server": "http://s",
                          "turn": "1"}
    assert verdict(FaultKind.MODEL_TIMEOUT, _traj(1, Reason.STEP_TIMEOUT, None)).evidence == {}
    phase = {"verdicts": [v], "clean": {"unexplained": [], "attempts": 0, "trainable": 0,
                                        "collateral_inference_error": 0},
             "errors": [], "rounds": [], "injector_errors": [], "injector_missed": 0,
             "proxy": {}, "engine": {}, "seconds": 0.0, "kill_phase_s": 0.0}
    from rollbank_bench import faults

    parser = argparse.ArgumentParser()
    faults.add_arguments(parser)
    report = summarize_campaign(phase, {}, parser.parse_args([]))
    assert report["misattributed"][0]["evidence"]["server"] == "http://s"
