"""The event log and the batches on disk agree after a SIGKILL (issue 24, defect 7).

A SIGKILL loses what is not yet written to the kernel: a buffered log line. While the
collector waits in ``on_batch`` (a trainer step, the service's back-pressure: seconds to
hours), a batch is complete on disk; ``collector.batch_written`` must already be in
``events.jsonl`` then, read from the file as a crashed process would leave it."""

from __future__ import annotations

from pathlib import Path

from episode_rig import FileVerifier, fake_spec, make_task
from test_collector import TOK, config, model

from rollbank.batching.batch import Batch
from rollbank.batching.writer import ready_batches
from rollbank.collector import collect
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.inference.fake import make_fake_fleet
from rollbank.inference_plane import InferencePlane
from rollbank.metrics.bound import Capacity
from rollbank.metrics.events import read_events
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool


async def test_batch_written_is_on_disk_while_on_batch_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    seen: list[tuple[int, list[int], list[int]]] = []

    async def on_batch(batch: Batch, path: Path) -> None:  # a SIGKILL here keeps only the file
        logged = [e["batch_index"] for e in read_events(out / "events.jsonl")
                  if e["kind"] == "collector.batch_written"]
        on_disk = [int(p.name.split("-")[1]) for p in ready_batches(out / "batches")]
        seen.append((batch.index, logged, on_disk))

    _, clients = make_fake_fleet(2, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        await collect(config(), tasks=[make_task()], inference=plane, sandboxes=sandboxes,
                      out_dir=out, capacity=Capacity(100.0, 400.0, 1000.0, 4000.0, sandbox_slots=4),
                      on_batch=on_batch)
    assert [s[0] for s in seen] == [0, 1]
    for index, logged, on_disk in seen:
        assert logged == on_disk, f"batch {index}: log names {logged}, disk holds {on_disk}"
