"""Integration: ``rollbank train --publisher colocated`` end to end, as its own process.

One vLLM engine (tiny model, eager) runs inside the trainer's process, the episodes of real
bubblewrap sandboxes generate through it, and each step's tensors are handed to the same
engine by reference (staged reload, swapped in between two engine steps): sync, 2 steps of
2x2. Checks what the other patterns' loop test checks — the Parquet batches' per-token
versions go from 0 to 1 (the engine's own tags), each publication's record is the colocated
pattern's with its latency apart from its apply pause and every tensor of the model handed
over (``loop.compact = false``), the engine serves the trainer's last
version — and that no vLLM server process was started. A subprocess, because the in-process
engine sets vLLM environment variables that must not leak into the other tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rollbank.batching.writer import PARQUET_NAME, ready_batches
from rollbank.inference.publishing.state import read_safetensors_meta
from rollbank.training.checkpoint import latest_version

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_rollbank_train_colocated_two_steps(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rollbank.cli.main", "train", "--publisher", "colocated",
           "--steps", "2", "--groups", "2", "--group-size", "2", "--out", str(out),
           "--set", 'collect.include=["hello-greeting","count-lines"]',
           "--set", "collect.fenced_shell.max_tokens=32", "--set", "collect.metrics.report=false",
           "--set", "collect.metrics.live=off", "--set", "collect.inference.calibrate=false",
           "--set", "collect.inference.managed.compile=eager",
           # every tensor every time: with 2x2 groups of a tiny model the rewards are often all
           # equal (zero advantage, zero gradient, unchanged weights), and the compact diff then
           # rightly hands over nothing; the test checks the in-memory handover itself
           "--set", "loop.compact=false"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["publication", "step"] * 2
    pubs = [r for r in records if r["kind"] == "publication"]
    reference = read_safetensors_meta(out / "weights" / "v000001")
    reference_bytes = sum(math.prod(shape) * torch.tensor([], dtype=getattr(torch, dtype)).element_size()
                          for shape, dtype in reference.values())
    for v, p in enumerate(pubs, start=1):
        d = p["detail"]
        assert p["pattern"] == d["pattern"] == "colocated" and d["ok"] and d["plan"] == "pause"
        assert d["version"] == v and d["serving"] == {"colocated": v}  # the engine's own label
        # handed over in memory, no checkpoint first: every tensor of the served model
        assert d["tensors"] == len(reference) and d["bytes"] == reference_bytes
        assert 0 < p["apply_pause_s"] <= p["publication_s"]
        assert {"stage_s", "apply_s", "wait_step_s"} <= set(d["steps_s"])
    steps = [r for r in records if r["kind"] == "step"]
    assert [sorted(s["versions"]) for s in steps] == [["0"], ["1"]]  # engine-reported versions
    dirs = ready_batches(out / "batches")
    assert len(dirs) == 2
    for k, b in enumerate(dirs):
        table = pq.read_table(b / PARQUET_NAME)
        assert {v for row in table.column("policy_versions").to_pylist() for v in row if v >= 0} == {k}
    assert latest_version(out / "weights") == 2  # the checkpoint written after each publication
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["final_version"] == summary["served_version"] == 2
    assert "vllm serve" not in proc.stderr and "server 0 ready" not in proc.stderr
    print(proc.stderr[-3000:])
    print("publications:", json.dumps([{k: p[k] for k in ("version", "publication_s", "apply_pause_s")}
                                       for p in pubs]))
