"""The soak's drained readings: judged from the first round by which every kind of round has
run once, and never counted while another reading is open.

The smoke soak (bench/tests/integration/test_bench_soak_faults.py) failed on both: the first
agent round loaded the agent stack (RSS +36 MiB once, over the 32 MiB allowance), and a
drained reading taken while the periodic probe's reading ran in another thread counted its
``/proc`` files (fds 11 -> 15 on the last round while the descriptor list beside it held 11)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rollbank_bench import soak_probe
from rollbank_bench.soak_faults import drained_from


def test_judged_rounds_start_once_every_kind_has_run() -> None:
    rounds = [{"round": i, "agents": i % 2 == 1} for i in range(5)]
    assert [r["round"] for r in drained_from(rounds)] == [1, 2, 3, 4]
    plain = [{"round": i, "agents": False} for i in range(3)]
    assert drained_from(plain) == plain
    assert drained_from(rounds[:2]) == rounds[:2]  # too few left: all of them


def test_a_reading_does_not_count_another_readings_open_files(tmp_path: Path) -> None:
    held = threading.Event()
    release = threading.Event()
    real = soak_probe._descendants

    def slow_descendants(root: int) -> int:  # holds files open, as the /proc walk does
        with (tmp_path / "a").open("w"), (tmp_path / "b").open("w"):
            held.set()
            release.wait(5)
            return real(root)

    soak_probe._descendants = slow_descendants
    try:
        t = threading.Thread(target=soak_probe.sample, args=(lambda: 0,))
        t.start()
        assert held.wait(5)
        seen: list[float] = []
        reader = threading.Thread(target=lambda: seen.append(soak_probe.sample(lambda: 0)["fds"]))
        reader.start()
        time.sleep(0.2)
        release.set()
        t.join(5)
        reader.join(5)
    finally:
        soak_probe._descendants = real
    assert seen and seen[0] == soak_probe.sample(lambda: 0)["fds"]
