"""The TensorBoard and W&B sinks with the real libraries, writing real files offline.

Each test is skipped when its extra (``rollbank[tensorboard]``, ``rollbank[wandb]``) is not
installed. Nothing contacts a server: W&B runs in offline mode.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.metrics.tensorboard import open_tensorboard
from rollbank.metrics.wandb import open_wandb
from rollbank.scheduling.policy.events import (
    AttemptEvent,
    AttemptFinished,
    BatchEvent,
    Event,
    EventKind,
)

pytestmark = pytest.mark.integration


def events() -> list[Event]:
    out: list[Event] = []
    for slot in range(3):
        out.append(AttemptEvent(kind=EventKind.LAUNCHED, t=0.0, attempt_id=f"g0/s{slot}/r0",
                                group_id="g0", task_id="task", slot=slot, retry=0, seq=0))
    for slot in range(3):
        out.append(AttemptFinished(
            kind=EventKind.FINISHED, t=1.0 + slot, attempt_id=f"g0/s{slot}/r0", group_id="g0",
            task_id="task", slot=slot, retry=0, seq=0,
            outcome=EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=0.5 * slot),
            duration_s=1.0 + slot, model_tokens=10 * (slot + 1), total_tokens=50))
    out.append(BatchEvent(kind=EventKind.BATCH_READY, t=3.5, batch_index=0, groups=1,
                          trajectories=3, window_start=0.0))
    return out


def read_tfevents(path: Path) -> list[bytes]:
    """The records of a TFRecord file: u64 length, u32 crc, data, u32 crc."""
    data, records, i = path.read_bytes(), [], 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        records.append(data[i + 12:i + 12 + n])
        i += 12 + n + 4
    return records


def test_tensorboard_event_file_holds_the_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto.event_pb2 import Event as TfEvent

    sink = open_tensorboard(tmp_path / "tb")
    for e in events():
        sink.emit(e)
    sink.close()
    [path] = (tmp_path / "tb").glob("events.out.tfevents.*")
    got: dict[tuple[str, int], float] = {}
    for rec in read_tfevents(path):
        ev = TfEvent.FromString(rec)
        for v in ev.summary.value:
            got[(v.tag, ev.step)] = v.simple_value
    assert got[("attempt/reward", 3)] == 1.0
    assert got[("attempt/model_tokens", 2)] == 20.0
    assert got[("batch/time_to_batch_s", 0)] == 3.5
    assert got[("batch/trajectories", 0)] == 3.0
    assert len(got) == sink.points


def test_wandb_offline_run_is_written_locally(tmp_path: Path) -> None:
    wandb = pytest.importorskip("wandb")
    sink = open_wandb(tmp_path / "wb", name="rollbank-test", config={"groups": 1})
    for e in events():
        sink.emit(e)
    sink.close()
    wandb.teardown()  # the local writer finishes the file when its service stops
    [run_dir] = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    [log] = run_dir.glob("run-*.wandb")
    raw = log.read_bytes()
    for tag in (b"attempt/reward", b"attempt/step", b"batch/time_to_batch_s", b"batch/step"):
        assert tag in raw
    assert sink.points == 3 * 5 + 9  # 3 attempts x 5 series, 1 batch x 9 series
