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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rollbank.batching.batch import Batch
from rollbank.batching.schema import SCHEMA_NAME, SCHEMA_VERSION, batch_summary, batch_to_table

PARQUET_NAME = "trajectories.parquet"
MANIFEST_NAME = "manifest.json"
LATEST_NAME = "LATEST"


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


def write_batch(root: Path, batch: Batch, *, extra: dict[str, Any] | None = None) -> Path:
    """Write ``batch`` under ``root`` atomically; return its final directory."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / batch_dir_name(batch.index)
    if final.exists():
        raise FileExistsError(f"{final} already exists; batches are written once")
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        table = batch_to_table(batch)
        parquet = tmp / PARQUET_NAME
        pq.write_table(table, parquet, compression="zstd")
        _fsync_file(parquet)
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
        _fsync_file(tmp / MANIFEST_NAME)
        _fsync_dir(tmp)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    latest_tmp = root / f".{LATEST_NAME}.tmp-{os.getpid()}"
    latest_tmp.write_text(f"{batch.index}\n")
    latest_tmp.replace(root / LATEST_NAME)
    return final


def ready_batches(root: Path) -> list[Path]:
    """Complete batch directories under ``root``, by index (temporary ones are ignored)."""
    if not root.is_dir():
        return []
    return sorted(
        p for p in root.iterdir()
        if p.is_dir() and p.name.startswith("batch-") and (p / MANIFEST_NAME).is_file()
    )
