"""An interrupted collection still leaves summary.json, report.html and the end summary."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest
from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.batching.batch import Batch
from rollbank.collect_config import load_collect_config
from rollbank.collector import collect
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference_plane import InferencePlane
from rollbank.metrics.bound import Capacity
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool

TOK = FakeTokenizer()
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def model(req: GenerateRequest) -> str:
    slot = int(req.request_id.split("/s")[1].split("/")[0])
    if "\nOutput:" in TOK.decode(list(req.prompt_token_ids)).split("Task: Write hello")[-1]:
        return "DONE\n"
    return "```bash\necho hello > out.txt\n```\n" if slot % 2 == 0 else "DONE\n"


async def test_a_collection_cancelled_after_its_first_batch_writes_summary_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: an interrupted collect (Ctrl-C, SIGTERM) left no summary.json, no report
    and no end summary, although a batch had been written."""
    cfg = load_collect_config(None, {
        "inference.calibrate": False, "metrics.live": "auto", "task_order_seed": None,
        "metrics.report": HAVE_MATPLOTLIB, "scheduler.groups_per_batch": 1,
        "scheduler.pool_groups": 1, "scheduler.bank.group_size": 2,
        "scheduler.num_batches": 50, "scheduler.sandbox_slots": 2,
    })
    _, clients = make_fake_fleet(1, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    written = asyncio.Event()

    async def on_batch(batch: Batch, path: Path) -> None:
        written.set()

    out = tmp_path / "run"
    backend = FakeBackend(files={"/app/.keep": b""})
    async with WarmPool(backend) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            run = asyncio.create_task(collect(
                cfg, tasks=[make_task()], inference=plane, sandboxes=sandboxes, out_dir=out,
                capacity=Capacity(100.0, 400.0, 1000.0, 4000.0, sandbox_slots=2),
                on_batch=on_batch))
            await written.wait()
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "stopped by a signal or cancelled"
    assert len(summary["batches"]) >= 1 and summary["ledger"]["launched"] >= 2
    assert "run interrupted (stopped by a signal or cancelled): " in stderr.getvalue()
    if HAVE_MATPLOTLIB:
        assert "Interrupted (stopped by a signal or cancelled)" in (out / "report.html").read_text()
