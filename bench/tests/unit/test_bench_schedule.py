"""bench schedule: the virtual-time sweep runs the real scheduler on the trace workload."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollbank_bench.schedule import _main, add_arguments


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_sweep_reports_every_cell_with_spread() -> None:
    a = args("--groups", "4", "--group-size", "4", "--pool-groups", "4,8", "--sandbox-slots",
             "64", "--batches", "3", "--repeats", "3", "--trace", "turns_task_sigma=1.0")
    out = _main(a)
    assert [(c["sandbox_slots"], c["pool_groups"]) for c in out["cells"]] == [(64, 4), (64, 8)]
    assert out["size"]["repeats"] == 3 and out["workload"]["turns_task_sigma"] == 1.0
    same, over = out["cells"]
    for c in out["cells"]:
        assert c["ratio"]["min"] <= c["ratio"]["median"] <= c["ratio"]["max"]
        assert c["naive_s"]["median"] > 0
    # G' = G launches what naive launches: nothing is left over at the end of the window
    assert same["waste_attempts"]["max"] == 0
    # with slots to spare and a heavy per-task tail, over-provisioning shortens the batch
    # and pays for it in unconsumed attempts
    assert over["ratio"]["median"] < same["ratio"]["median"]
    assert over["waste_attempts"]["median"] > 0


def test_scale_run_times_both_arms_and_what_if_sweeps_every_factor(tmp_path: Path) -> None:
    from rollbank_bench.schedule_scale import WHAT_IF

    plot = tmp_path / "what-if.png"
    a = args("--groups", "4", "--group-size", "4", "--pool-groups", "6", "--sandbox-slots",
             "32", "--verifier-slots", "4", "--trajectories", "64", "--what-if",
             "--what-if-trajectories", "32", "--plot", str(plot))
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        a.plot = ""
    out = _main(a)
    scale = out["scale"]
    assert scale["batches"] == 4  # ceil(64 / (4 x 4))
    for arm in ("naive", "optimized"):
        assert scale[arm]["trajectories"] <= 64 and scale[arm]["launched"] >= 60
        assert scale[arm]["cpu_s"] >= 0 and scale[arm]["wall_s"] >= 0
    assert out["per_attempt"]["model"] == "contention"
    rows = out["what_if"]["rows"]
    assert [(r["factor"], r["value"]) for r in rows] == [
        (f, v) for f, vs in WHAT_IF.items() for v in vs]
    assert all(r["naive_s"] > 0 and r["optimized_s"] > 0 for r in rows)
    if a.plot:
        assert plot.stat().st_size > 0


def test_decision_cost_keeps_n_in_flight_and_times_every_decision() -> None:
    import argparse

    from rollbank_bench.schedule_decision import decision_cost

    out = decision_cost(argparse.Namespace(decision_cost=40, group_size=4, groups=2,
                                           decisions=300))
    assert out["in_flight_min"] == out["in_flight_max"] == 40
    assert out["per_decision_ms"]["n"] == out["per_decision_cpu_ms"]["n"] == 300
    assert out["batches_emitted"] == out["batch_emitting_decisions_ms"]["n"] > 0
    assert set(out["target"]) >= {"measured_cpu_p99", "measured_wall_p99", "met_cpu", "met_wall"}


def test_scale_arms_pause_the_garbage_collector_only_while_they_run() -> None:
    import gc

    from rollbank_bench.schedule_scale import _gc_paused

    assert gc.isenabled()
    with _gc_paused(False):
        assert not gc.isenabled()
    assert gc.isenabled()
    with _gc_paused(True):  # --gc: left on
        assert gc.isenabled()
    try:
        with _gc_paused(False):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert gc.isenabled()
    out = _main(args("--groups", "2", "--group-size", "2", "--pool-groups", "3",
                     "--sandbox-slots", "4", "--trajectories", "8"))
    assert out["gc_paused_per_arm"] is True and gc.isenabled()


def test_parallel_arms_simulate_exactly_what_the_sequential_arms_do() -> None:
    base = ["--groups", "4", "--group-size", "4", "--pool-groups", "6", "--sandbox-slots", "32",
            "--trajectories", "128", "--model", "durations"]
    seq = _main(args(*base))
    par = _main(args(*base, "--parallel-arms"))
    assert par["scale"]["arms_in_parallel"] and not seq["scale"]["arms_in_parallel"]
    assert par["both_arms_wall_s"] == par["scale"]["pair_wall_s"]
    for arm in ("naive", "optimized"):  # plans drawn per process: the same simulated world
        keep = ("trajectories", "batches", "launched", "time_per_batch_s", "waste")
        assert {k: par["scale"][arm][k] for k in keep} == {k: seq["scale"][arm][k] for k in keep}
    assert par["scale"]["ratio"] == seq["scale"]["ratio"]
