"""The batch directory never shows a half-written batch: the writer is SIGKILLed at every step.

Each case runs :func:`write_batch` in a child process whose ``step`` hook kills the process
at one point of :data:`WRITE_STEPS`; the parent then looks at ``batches/`` the way a trainer
does (a listing, :func:`ready_batches`, :func:`read_batch_dir`) and writes the next batch.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_batching_schema import make_batch

from rollbank.batching.batch import Batch
from rollbank.batching.loader import read_batch_dir
from rollbank.batching.writer import (
    LATEST_NAME,
    WRITE_STEPS,
    batch_dir_name,
    clean_leftovers,
    ready_batches,
    write_batch,
)

SRC = Path(__file__).resolve().parents[2] / "src"

CHILD = """
import os, pickle, signal, sys
from pathlib import Path
from rollbank.batching.writer import write_batch
root, batch_file, kill_at = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with open(batch_file, "rb") as f:
    batch = pickle.load(f)
def step(name: str) -> None:
    if name == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
write_batch(root, batch, step=step)
"""


def _with_index(batch: Batch, index: int) -> Batch:
    return dataclasses.replace(batch, index=index)


def _write_in_child(root: Path, batch: Batch, kill_at: str, tmp_path: Path) -> int:
    batch_file = tmp_path / f"batch-{batch.index}.pickle"
    batch_file.write_bytes(pickle.dumps(batch))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root), str(batch_file), kill_at],
                          env=env, capture_output=True, text=True, check=False)
    return proc.returncode


def _trainer_view(root: Path) -> list[int]:
    """What a trainer would take as complete batches: every listed ``batch-*`` must load."""
    listed = sorted(p for p in root.iterdir() if p.name.startswith("batch-"))
    assert listed == ready_batches(root)  # nothing listed that is not ready
    indices = []
    for p in listed:
        table = read_batch_dir(p)  # complete: manifest, checksum, schema, row count
        assert table.num_rows > 0
        indices.append(int(p.name.removeprefix("batch-")))
    return indices


@pytest.mark.parametrize("kill_at", WRITE_STEPS)
def test_a_writer_killed_at_any_step_leaves_the_whole_batch_or_nothing(
        tmp_path: Path, kill_at: str) -> None:
    root = tmp_path / "batches"
    batch = make_batch()
    write_batch(root, batch)  # batch 0 complete before the crash
    rc = _write_in_child(root, _with_index(batch, 1), kill_at, tmp_path)
    assert rc == -signal.SIGKILL
    seen = _trainer_view(root)
    renamed = WRITE_STEPS.index(kill_at) >= WRITE_STEPS.index("renamed")
    assert seen == ([0, 1] if renamed else [0])
    latest = int((root / LATEST_NAME).read_text())
    assert latest in seen and latest <= max(seen)  # LATEST may lag, never lead
    # the next write (batch 1 again if it was lost, else batch 2) removes the leftovers
    nxt = 2 if renamed else 1
    write_batch(root, _with_index(batch, nxt))
    assert _trainer_view(root) == list(range(nxt + 1))
    assert int((root / LATEST_NAME).read_text()) == nxt
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]


def test_killed_before_rename_leaves_a_hidden_leftover_that_readers_ignore(tmp_path: Path) -> None:
    root = tmp_path / "batches"
    batch = make_batch()
    assert _write_in_child(root, batch, "manifest_synced", tmp_path) == -signal.SIGKILL
    hidden = [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert len(hidden) == 1 and hidden[0].startswith(f".{batch_dir_name(0)}.tmp-")
    assert ready_batches(root) == [] and _trainer_view(root) == []
    assert clean_leftovers(root) == hidden and list(root.iterdir()) == []


def test_rewriting_a_batch_index_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "batches"
    batch = make_batch()
    write_batch(root, batch)
    with pytest.raises(FileExistsError):
        write_batch(root, batch)
