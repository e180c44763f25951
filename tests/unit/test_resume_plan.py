"""prepare_resume on a hand-made crashed run folder: batches, log segments, accounting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_batching_schema import make_batch

from rollbank.batching.loader import read_batch_dir
from rollbank.batching.writer import write_batch
from rollbank.collect_config import load_collect_config
from rollbank.config import dump_resolved
from rollbank.metrics.events import EventLog, read_events
from rollbank.resume import prepare_resume, write_record


def _launched(aid: str, seq: int) -> dict[str, Any]:
    return {"kind": "launched", "t": 0.0, "attempt_id": aid, "group_id": aid.split("/")[0],
            "task_id": "task-a", "slot": 0, "retry": 0, "seq": seq}


def _run(tmp_path: Path, lines: list[dict[str, Any]], tail: bytes = b"") -> tuple[Path, list[str]]:
    run = tmp_path / "run"
    cfg = load_collect_config(None, {"scheduler.num_batches": 3})
    dump_resolved(cfg, run)
    path = write_batch(run / "batches", make_batch())
    in_batch = [str(a) for a in read_batch_dir(path).column("trajectory_id").to_pylist()]
    (run / "batches" / ".batch-000001.tmp-99").mkdir()  # a writer killed mid-batch
    text = "".join(json.dumps(d) + "\n" for d in lines)
    (run / "events.jsonl").write_bytes(text.encode() + tail)
    return run, in_batch


def test_the_plan_partitions_the_crashed_launches(tmp_path: Path) -> None:
    batch_ids = [str(a) for a in read_batch_dir(
        write_batch(tmp_path / "probe", make_batch())).column("trajectory_id").to_pylist()]
    lines = [{"kind": "collector.run_started", "t": 0.0}]
    lines += [_launched(a, int(a[1:6])) for a in batch_ids]
    lines += [_launched("g00007/s0/r0", 7), _launched("g00007/s1/r0", 7),
              _launched("g00008/s0/r0", 8)]
    lines += [{"kind": "finished", "t": 1.0, "attempt_id": "g00007/s1/r0"}]
    run, in_batch = _run(tmp_path, lines, tail=b'{"kind": "finished", "attempt_id": "g000')
    assert in_batch == batch_ids
    plan = prepare_resume(run)
    assert plan.written == [0] and plan.next_index == 1 and plan.remaining == 2
    assert plan.next_seq == 9  # after the highest group seen
    c = plan.record["crashed_run"]
    assert c["launched"] == len(batch_ids) + 3 and c["in_written_batches"] == len(batch_ids)
    assert c["settled_not_batched"] == ["g00007/s1/r0"]
    assert [a["attempt_id"] for a in c["in_flight"]] == ["g00007/s0/r0", "g00008/s0/r0"]
    assert plan.record["leftovers_removed"] == [".batch-000001.tmp-99"]
    assert plan.record["log_repaired"]["cut_bytes"] > 0
    assert not (run / "batches" / ".batch-000001.tmp-99").exists()
    # the resume is logged; a second crash before anything launched accounts nothing again
    with EventLog(run / "events.jsonl") as log:
        write_record(plan, log, 2.0)
    kinds = [e["kind"] for e in read_events(run / "events.jsonl")]
    assert kinds.count("collector.crashed_attempt") == 2
    again = prepare_resume(run)
    assert again.record["crashed_run"]["launched"] == 0 and again.next_seq == 9
    assert len(json.loads((run / "resume.json").read_text())) == 1
