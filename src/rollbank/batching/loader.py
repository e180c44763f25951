"""Load trainable batches as torch tensors (from a batch directory or an in-process Batch).

Owns the conversion of schema-v2 rows (version-1 rows are upgraded with neutral staleness
values, :func:`rollbank.batching.schema.upgrade_table`) into right-padded tensors. Positions are aligned with
``token_ids``: ``old_logprobs[b, t]`` is the behaviour log-prob of token ``t`` given the
tokens before it, valid where ``loss_mask[b, t] == 1``; the trainer shifts for next-token
prediction. Nothing is truncated silently: a row longer than ``max_len`` is an error.

Invariants
- ``attention_mask`` is 1 exactly on the row's real tokens; padding has ``loss_mask == 0``,
  ``old_logprobs == 0``, ``policy_versions == -1``, ``is_weights == 0`` and ``is_keep == 0``.
- ``is_keep <= loss_mask`` everywhere (a correction can only remove model tokens);
  ``current_logprobs`` is present when at least one row was measured (``measured[b]``), and
  holds 0 on the rows that were not.
- A directory is read only if its manifest's schema version matches and the parquet's
  sha256 equals the manifest's (``verify=True``).

torch comes from the ``train`` extra (``pip install 'rollbank[train]'``); it is imported when
tensors are made, so :func:`read_batch_dir` and ``import rollbank.batching.loader`` work
without it, and a missing torch is a :class:`~rollbank.extras.MissingExtraError` naming the
extra.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollbank.batching.batch import Batch
from rollbank.batching.schema import (
    SCHEMA,
    SchemaError,
    batch_to_table,
    check_schema,
    staleness_report_of,
    upgrade_table,
)
from rollbank.batching.writer import MANIFEST_NAME, PARQUET_NAME
from rollbank.extras import require

if TYPE_CHECKING:
    import torch

_FEATURE = "loading a batch as torch tensors"


@dataclass(frozen=True)
class TensorBatch:
    """Right-padded tensors for B trajectories of up to T tokens."""

    input_ids: torch.Tensor  # [B, T] int64, padded with pad_id
    attention_mask: torch.Tensor  # [B, T] int64
    loss_mask: torch.Tensor  # [B, T] float32 (1.0 on model-sampled tokens)
    old_logprobs: torch.Tensor  # [B, T] float32 behaviour log-probs
    policy_versions: torch.Tensor  # [B, T] int32, -1 on prompt/env/padding
    advantages: torch.Tensor  # [B] float32, one per trajectory
    rewards: torch.Tensor  # [B] float32
    prompt_lens: torch.Tensor  # [B] int64
    group_index: torch.Tensor  # [B] int64, dense group number within this tensor batch
    trajectory_ids: tuple[str, ...]
    # staleness (schema v2); None only on TensorBatches built by hand (then: weight 1, keep all)
    is_weights: torch.Tensor | None = None  # [B, T] float32 correction weight per token
    is_keep: torch.Tensor | None = None  # [B, T] float32, 1 where the token stays in the loss
    gate_weight: torch.Tensor | None = None  # [B] float32 staleness gate weight per row
    current_logprobs: torch.Tensor | None = None  # [B, T] float32; None: no row measured
    measured: torch.Tensor | None = None  # [B] bool, row has current_logprobs
    correction_mode: str | None = field(default=None)  # mode recorded in the staleness report
    # schema 2.1: which segment each token is in (0.., -1 on padding); a token is conditioned
    # only on the earlier tokens of its own segment (docs/chat.md). None: built by hand (one).
    segment_ids: torch.Tensor | None = None  # [B, T] int64

    @property
    def token_advantages(self) -> torch.Tensor:
        """[B, T] advantage broadcast over the row's model tokens (0 elsewhere)."""
        return self.advantages[:, None] * self.loss_mask


class BatchFileError(SchemaError):
    """A batch directory that cannot be read as written (missing, truncated or corrupt
    manifest or parquet, rows that contradict themselves). Names the file; still a
    :class:`SchemaError` for callers that catch that."""


_LIST_COLUMNS = ("token_ids", "logprobs", "policy_versions", "loss_mask", "current_logprobs",
                 "is_weights", "is_keep")
_FINITE_COLUMNS = ("reward", "advantage", "gate_weight")


def read_batch_dir(path: Path, *, verify: bool = True) -> pa.Table:
    """Read ``batch-NNNNNN/``; checks its manifest, checksum, schema version, column types
    and that every row's per-token lists are ``num_tokens`` long. Every failure is a
    :class:`BatchFileError` naming the file."""
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        raise BatchFileError(f"no {MANIFEST_NAME}; the batch is not complete", file=manifest_path)
    try:
        manifest = json.loads(manifest_path.read_bytes())
        expected_sha = manifest["files"][PARQUET_NAME]["sha256"]
        expected_rows = manifest["rows"]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise BatchFileError(f"unreadable manifest ({exc!r})", file=manifest_path) from exc
    if isinstance(expected_rows, bool) or not isinstance(expected_rows, int):
        raise BatchFileError(f"rows is {expected_rows!r}", file=manifest_path, field="rows")
    parquet = path / PARQUET_NAME
    try:
        if verify and hashlib.sha256(parquet.read_bytes()).hexdigest() != expected_sha:
            raise BatchFileError(f"sha256 does not match {MANIFEST_NAME}", file=parquet)
        table = pq.read_table(parquet)
    except (OSError, pa.ArrowException) as exc:
        raise BatchFileError(f"unreadable parquet ({exc})", file=parquet) from exc
    if table.num_rows != expected_rows:
        raise BatchFileError(f"{table.num_rows} rows, {MANIFEST_NAME} says {expected_rows}", file=parquet)
    try:
        check_schema(table.schema)
        table.validate(full=True)  # e.g. invalid UTF-8 in a string column (a flipped byte)
        _check_rows(table, parquet)
        return upgrade_table(table)
    except BatchFileError:
        raise
    except (SchemaError, ValueError, pa.ArrowException) as exc:  # ValueError: metadata JSON
        raise BatchFileError(str(exc), file=parquet) from exc


def _check_rows(table: pa.Table, file: Path) -> None:
    """Column types as the schema says, no nulls where none may be, per-token lists as long as
    ``num_tokens``, finite rewards, advantages and log-probs (``verify=False`` reads and files
    from other writers get here unchecked by a checksum)."""
    for name in table.schema.names:
        if name not in SCHEMA.names:
            continue
        want = SCHEMA.field(name)
        col = table.column(name)
        if table.schema.field(name).type != want.type:
            raise BatchFileError(f"column {name} has type {col.type}, expected {want.type}",
                                 file=file, field=name)
        if not want.nullable and col.null_count:
            raise BatchFileError(f"column {name} has {col.null_count} null(s)", file=file, field=name)
    lengths = table.column("num_tokens")
    for name in _LIST_COLUMNS:
        if name not in table.schema.names:
            continue
        col = table.column(name)
        same = pc.equal(pc.list_value_length(col), lengths)
        if pc.all(pc.or_kleene(same, pc.is_null(col))).as_py() is False:
            raise BatchFileError(f"a row's {name} is not num_tokens long", file=file, field=name)
        if pa.types.is_floating(col.type.value_type) and pc.all(
                pc.is_finite(pc.list_flatten(col))).as_py() is False:
            raise BatchFileError(f"a row's {name} holds a non-finite value", file=file, field=name)
    for name in _FINITE_COLUMNS:
        if name in table.schema.names and pc.all(pc.is_finite(table.column(name))).as_py() is False:
            raise BatchFileError(f"column {name} holds a non-finite value", file=file, field=name)
    _check_ranges(table, file)
    _check_segments(table, file)


def _check_segments(table: pa.Table, file: Path) -> None:
    """``segment_starts`` (2.1): starts at 0, strictly increasing, inside the row."""
    if "segment_starts" not in table.schema.names:
        return
    for starts, n in zip(table.column("segment_starts").to_pylist(),
                         table.column("num_tokens").to_pylist(), strict=True):
        ok = bool(starts) and starts[0] == 0 and all(a < b for a, b in itertools.pairwise(starts))
        if not ok or (n and starts[-1] >= n):
            raise BatchFileError(f"a row's segment_starts {starts[:8]} is not 0 < ... < num_tokens",
                                 file=file, field="segment_starts")


def _segment_ids(table: pa.Table, lengths: np.ndarray, width: int) -> np.ndarray:
    out = np.full((len(lengths), width), -1, dtype=np.int64)
    for b, (starts, n) in enumerate(zip(table.column("segment_starts").to_pylist(), lengths,
                                        strict=True)):
        ends = [*starts[1:], int(n)]
        for k, (a, e) in enumerate(zip(starts, ends, strict=True)):
            out[b, a:e] = k
    return out


#: Per-token columns with a closed range of values: (column, lowest, highest or None).
_RANGES = (("loss_mask", 0, 1), ("is_keep", 0, 1), ("token_ids", 0, None),
           ("policy_versions", -1, None), ("is_weights", 0, None))


def _check_ranges(table: pa.Table, file: Path) -> None:
    """Values a trainer would misuse silently: a ``loss_mask`` or ``is_keep`` other than 0/1
    (a x7 gradient weight), a negative token id, a policy version below -1, a negative
    importance weight."""
    for name, low, high in _RANGES:
        if name not in table.schema.names:
            continue
        flat = pc.list_flatten(table.column(name))
        if len(flat) == 0:
            continue
        lo, hi = pc.min_max(flat).values()
        if lo.as_py() is not None and (lo.as_py() < low or (high is not None and hi.as_py() > high)):
            bad = lo.as_py() if lo.as_py() < low else hi.as_py()
            want = f"{low}..{high}" if high is not None else f">= {low}"
            raise BatchFileError(f"a row's {name} holds {bad} (allowed {want})", file=file, field=name)


def _padded(col: pa.ChunkedArray | pa.Array, lengths: np.ndarray, width: int,
            dtype: type[np.generic], fill: float) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    flat = arr.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    out = np.full((len(lengths), width), fill, dtype=dtype)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
    cols = np.arange(len(flat)) - np.repeat(starts, lengths)
    out[rows, cols] = flat
    return out


def _column(table: pa.Table, name: str, dtype: type[np.generic]) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.array(table.column(name).to_numpy(), dtype=dtype))  # a copy


def table_to_tensors(table: pa.Table, *, pad_id: int = 0, max_len: int | None = None) -> TensorBatch:
    """Convert schema-v2 (or v1, upgraded) rows to padded tensors (width = longest row)."""
    require("torch", "train", _FEATURE)
    import torch

    table = upgrade_table(table)
    lengths = np.asarray(table.column("num_tokens").to_numpy(), dtype=np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    if max_len is not None and width > max_len:
        raise ValueError(f"a trajectory has {width} tokens > max_len {max_len}")
    ids = _padded(table.column("token_ids"), lengths, width, np.int64, pad_id)
    lp = _padded(table.column("logprobs"), lengths, width, np.float32, 0.0)
    lm = _padded(table.column("loss_mask"), lengths, width, np.float32, 0.0)
    pv = _padded(table.column("policy_versions"), lengths, width, np.int32, -1)
    attn = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    isw = _padded(table.column("is_weights"), lengths, width, np.float32, 0.0)
    keep = _padded(table.column("is_keep"), lengths, width, np.float32, 0.0) * lm
    cur_col = table.column("current_logprobs")
    measured = np.asarray(cur_col.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
    current = None
    if measured.any():
        filled = pa.array(
            [v if v is not None else [0.0] * int(n)
             for v, n in zip(cur_col.to_pylist(), lengths, strict=True)],
            type=pa.list_(pa.float32()),
        )
        current = torch.from_numpy(_padded(filled, lengths, width, np.float32, 0.0))
    groups = table.column("group_id").to_pylist()
    dense = {g: i for i, g in enumerate(dict.fromkeys(groups))}
    return TensorBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        loss_mask=torch.from_numpy(lm),
        old_logprobs=torch.from_numpy(lp),
        policy_versions=torch.from_numpy(pv),
        advantages=_column(table, "advantage", np.float32),
        rewards=_column(table, "reward", np.float32),
        prompt_lens=_column(table, "prompt_len", np.int64),
        group_index=torch.tensor([dense[g] for g in groups], dtype=torch.int64),
        trajectory_ids=tuple(table.column("trajectory_id").to_pylist()),
        is_weights=torch.from_numpy(isw),
        is_keep=torch.from_numpy(keep),
        gate_weight=_column(table, "gate_weight", np.float32),
        current_logprobs=current,
        measured=torch.from_numpy(measured.copy()),
        correction_mode=_correction_mode(table.schema),
        segment_ids=torch.from_numpy(_segment_ids(table, lengths, width)),
    )


def _correction_mode(schema: pa.Schema) -> str | None:
    report = staleness_report_of(schema)
    correction = report.get("correction") if report else None
    mode = correction.get("mode") if isinstance(correction, dict) else None
    return str(mode) if mode is not None else None


def iter_tensor_batches(
    table: pa.Table, micro_batch_size: int, *, pad_id: int = 0, max_len: int | None = None
) -> Iterator[TensorBatch]:
    """Micro-batches of ``micro_batch_size`` rows in table order (each padded on its own)."""
    if micro_batch_size < 1:
        raise ValueError("micro_batch_size must be >= 1")
    for start in range(0, table.num_rows, micro_batch_size):
        yield table_to_tensors(
            table.slice(start, micro_batch_size), pad_id=pad_id, max_len=max_len
        )


def batch_tensors(batch: Batch, *, pad_id: int = 0, max_len: int | None = None) -> TensorBatch:
    """In-process path: the same tensors a trainer would load from the batch directory."""
    return table_to_tensors(batch_to_table(batch), pad_id=pad_id, max_len=max_len)
