"""`collect --resume`: a fake collection killed (SIGKILL) mid-run continues without losing,
rewriting or duplicating a batch, and accounts the attempts the crash left in flight.

The collection runs in a child process (resume_child.py: fake inference fleet, fake
sandboxes, 3 batches of 2 groups x 2); the parent watches its ``batches/`` directory.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollbank.batching.loader import read_batch_dir
from rollbank.batching.writer import ready_batches
from rollbank.errors import InputError
from rollbank.metrics.events import read_events
from rollbank.resume import prepare_resume

HERE = Path(__file__).resolve().parent
CHILD = HERE / "resume_child.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), str(HERE)])}
WAIT_S = 120.0  # a guard against a hung child, not a speed assertion


def _start(run: Path, *, resume: bool) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(CHILD), str(run), *(["--resume"] if resume else [])]
    return subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen[bytes]) -> None:
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err.decode()


def _kill_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready() and proc.poll() is None:
        assert time.monotonic() < deadline, "the child never reached the kill point"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=WAIT_S)


def _check_run(run: Path) -> dict[str, Any]:
    """The invariants a trainer and the accounting rely on, over the whole run folder."""
    batches = ready_batches(run / "batches")
    assert [p.name for p in batches] == ["batch-000000", "batch-000001", "batch-000002"]
    ids: list[str] = []
    groups: list[str] = []
    for p in batches:
        table = read_batch_dir(p)
        ids += table.column("trajectory_id").to_pylist()
        groups += list(dict.fromkeys(table.column("group_id").to_pylist()))
    assert len(ids) == len(set(ids)), "a trajectory is in two batches"
    assert len(groups) == len(set(groups)) == 6
    assert not [p.name for p in (run / "batches").iterdir() if p.name.startswith(".")]
    events = read_events(run / "events.jsonl")
    launched = Counter(e["attempt_id"] for e in events if e["kind"] == "launched")
    assert launched and max(launched.values()) == 1, "an attempt id was launched twice"
    assert set(ids) <= set(launched)
    # every record's accounting is a partition of the crashed segment's launches
    records = json.loads((run / "resume.json").read_text())
    for r in records:
        c = r["crashed_run"]
        assert c["launched"] == (c["in_written_batches"] + len(c["settled_not_batched"])
                                 + len(c["in_flight"]))
        for a in c["in_flight"]:
            assert a["outcome"] == "infra_failure" and a["detail"] == "collector_crashed"
    crashed = [e["attempt_id"] for e in events if e["kind"] == "collector.crashed_attempt"]
    assert len(crashed) == len(set(crashed)), "an in-flight attempt was accounted twice"
    assert not set(crashed) & set(ids), "a crashed attempt reached a batch"
    finished = {e["attempt_id"] for e in events if e["kind"] in ("finished", "aborted")}
    assert not set(crashed) & finished
    return {"records": records, "crashed": crashed, "launched": len(launched)}


def test_killed_after_the_first_batch_resumes_to_three_batches(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(run, resume=False)
    _kill_when(proc, lambda: len(ready_batches(run / "batches")) >= 1)
    before = {p.name: (p / "manifest.json").read_bytes() for p in ready_batches(run / "batches")}
    assert 1 <= len(before) < 3
    _finish(_start(run, resume=True))
    seen = _check_run(run)
    for name, manifest in before.items():  # not rewritten
        assert (run / "batches" / name / "manifest.json").read_bytes() == manifest
    [record] = seen["records"]
    assert record["batches_written"] == list(range(len(before)))
    assert record["next_batch_index"] == len(before)
    assert record["remaining_batches"] == 3 - len(before)
    assert record["next_seq"] > 0
    assert len(seen["crashed"]) == len(record["crashed_run"]["in_flight"])
    # resuming a finished run collects nothing and rewrites nothing
    _finish(_start(run, resume=True))
    assert len(ready_batches(run / "batches")) == 3
    assert json.loads((run / "resume.json").read_text())[-1]["remaining_batches"] == 0


def test_resume_refuses_a_folder_without_a_resolved_config(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such run folder"):
        prepare_resume(tmp_path / "absent")
    (tmp_path / "run").mkdir()
    with pytest.raises(InputError, match=r"config\.resolved\.json"):
        prepare_resume(tmp_path / "run")


def _after_first_line(events: Path, delay: float) -> Callable[[], bool]:
    """True ``delay`` seconds after the log grew (this process started collecting)."""
    base = events.stat().st_size if events.is_file() else 0
    t_ready: list[float] = []

    def ready() -> bool:
        if not t_ready and events.is_file() and events.stat().st_size > base:
            t_ready.append(time.monotonic())
        return bool(t_ready) and time.monotonic() - t_ready[0] >= delay

    return ready


@pytest.mark.integration
def test_many_kills_at_random_points_then_resume(tmp_path: Path) -> None:
    """The collector is killed at seeded random moments (a kill can land in a resumed run,
    before collection starts, or mid-write); each time the run is resumed."""
    kills = int(os.environ.get("ROLLBANK_RESUME_KILLS", "20"))
    rng = random.Random(13)
    run = tmp_path / "run"
    for _ in range(kills):
        proc = _start(run, resume=(run / "config.resolved.json").is_file())
        _kill_when(proc, _after_first_line(run / "events.jsonl", rng.uniform(0.0, 1.2)))
    _finish(_start(run, resume=(run / "config.resolved.json").is_file()))
    seen = _check_run(run)
    assert len(seen["records"]) >= 1
    # the kills did land while attempts were running, and each was accounted once
    assert len(seen["crashed"]) == sum(len(r["crashed_run"]["in_flight"]) for r in seen["records"])
    assert seen["crashed"]
