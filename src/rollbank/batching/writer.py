"""The batch directory: how a trainer in another process receives batches.

Layout under a run's ``batches/`` root::

    batches/
      batch-000000/
        trajectories.parquet   # schema: rollbank.batching.schema (version in its metadata)
        manifest.json          # schema version, row count, sha256 of the parquet, summary,
                               # staleness_report (rollbank.staleness.report; null: unmeasured)
      batch-000001/ ...
      LATEST                   # index of the newest complete batch (text)

Invariants
- A ``batch-NNNNNN`` directory is complete whenever it exists: it is written as a hidden
  temporary directory (files fsync'd), then renamed into place in one atomic step.
- ``manifest.json`` is the ready marker a reader checks; ``LATEST`` is replaced atomically
  after the rename. A batch index is written at most once (rewriting is an error).
- Crash safety: every file is fsync'd before the rename, the temporary directory before it
  is renamed, and ``batches/`` after the rename and after ``LATEST`` is replaced. A writer
  killed at any step leaves either the complete ``batch-NNNNNN`` or no such directory;
  its leftovers (hidden ``.batch-NNNNNN.tmp-PID`` / ``.LATEST.tmp-PID``) are ignored by
  readers and removed by the next write (:func:`clean_leftovers`). ``LATEST`` may lag the
  newest complete batch after a crash (never lead it); the next write repairs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rollbank.batching.batch import Batch
from rollbank.batching.schema import SCHEMA_NAME, SCHEMA_VERSION, batch_summary, batch_to_table

PARQUET_NAME = "trajectories.parquet"
MANIFEST_NAME = "manifest.json"
LATEST_NAME = "LATEST"

#: The points :func:`write_batch` reports to its ``step`` hook, in order (crash tests kill the
#: writer at each one).
WRITE_STEPS: tuple[str, ...] = (
    "tmp_created", "parquet_written", "parquet_synced", "manifest_written", "manifest_synced",
    "tmp_synced", "renamed", "root_synced", "latest_written", "latest_replaced", "done",
)

StepHook = Callable[[str], None]


def batch_dir_name(index: int) -> str:
    return f"batch-{index:06d}"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _is_leftover(name: str) -> bool:
    return name.startswith((".batch-", f".{LATEST_NAME}.tmp-")) and ".tmp-" in name


def clean_leftovers(root: Path, *, name: str | None = None) -> list[str]:
    """Remove temporary entries a killed writer left under ``root`` (all of them, or only
    those of batch directory ``name``); return the names removed."""
    if not root.is_dir():
        return []
    removed: list[str] = []
    for p in root.iterdir():
        if not _is_leftover(p.name):
            continue
        if name is not None and not p.name.startswith((f".{name}.tmp-", f".{LATEST_NAME}.tmp-")):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p.name)
    return sorted(removed)


def write_batch(root: Path, batch: Batch, *, extra: dict[str, Any] | None = None,
                step: StepHook | None = None) -> Path:
    """Write ``batch`` under ``root`` atomically; return its final directory.

    ``step`` (tests) is called with each name of :data:`WRITE_STEPS` as the write passes it.
    """
    hook: StepHook = step if step is not None else (lambda _name: None)
    root.mkdir(parents=True, exist_ok=True)
    final = root / batch_dir_name(batch.index)
    if final.exists():
        raise FileExistsError(f"{final} already exists; batches are written once")
    clean_leftovers(root, name=final.name)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    hook("tmp_created")
    try:
        table = batch_to_table(batch)
        parquet = tmp / PARQUET_NAME
        pq.write_table(table, parquet, compression="zstd")
        hook("parquet_written")
        _fsync_file(parquet)
        hook("parquet_synced")
        manifest = {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "rows": table.num_rows,
            "files": {PARQUET_NAME: {"sha256": _sha256(parquet), "bytes": parquet.stat().st_size}},
            "batch": batch_summary(batch),
            "staleness_report": (
                dict(batch.staleness.report)
                if batch.staleness is not None and batch.staleness.report is not None else None
            ),
            "extra": extra or {},
        }
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        hook("manifest_written")
        _fsync_file(tmp / MANIFEST_NAME)
        hook("manifest_synced")
        _fsync_dir(tmp)
        hook("tmp_synced")
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    hook("renamed")
    _fsync_dir(root)
    hook("root_synced")
    latest_tmp = root / f".{LATEST_NAME}.tmp-{os.getpid()}"
    latest_tmp.write_text(f"{batch.index}\n")
    _fsync_file(latest_tmp)
    hook("latest_written")
    latest_tmp.replace(root / LATEST_NAME)
    hook("latest_replaced")
    _fsync_dir(root)
    hook("done")
    return final


def ready_batches(root: Path) -> list[Path]:
    """Complete batch directories under ``root``, by index (temporary ones are ignored)."""
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir()
        if p.is_dir() and p.name.startswith("batch-") and (p / MANIFEST_NAME).is_file()
    )
