"""The Arrow schema of a trainable batch, version 2.1: one row per trainable trajectory.

Owns the column layout and the conversion :func:`batch_to_table` from a
:class:`~rollbank.batching.batch.Batch`. Readers check ``SCHEMA_VERSION`` in the schema
metadata (key ``rollbank.schema_version``) and refuse unknown major versions; version 1 files
(no staleness columns) are still read: :func:`upgrade_table` adds the staleness columns with
their neutral values.

Version 2 adds the staleness columns (:data:`STALENESS_FIELDS`, issue #11): the current
policy's log-prob of each token when it was measured, the per-token importance weights and
keep mask of the active correction, the staleness gate's verdict and weight, and the row's
divergence statistics. They are filled from ``Batch.staleness`` (computed by
``rollbank.staleness.rows``); a row that was not measured gets the neutral values
(``current_logprobs`` and ``divergence`` null, ``scorer_version`` -1, ``is_weights`` = 1 and
``is_keep`` = 1 on model tokens, ``gate_verdict`` "unmeasured", ``gate_weight`` 1). The batch's
staleness report (or null) is stored as JSON under the metadata key ``rollbank.staleness``.

Version 2.1 adds ``segment_starts`` (chat harness, gateway: docs/chat.md): the token offsets
where a segment begins. A model token in the segment starting at ``s`` was conditioned on the
tokens from ``s`` up to it, not on earlier segments (a chat template that rewrote earlier
turns, or an agent that edited its history, gave a re-rendered prompt, recorded as a new
segment instead of re-tokenising the old one). ``[0]``: one segment, as every row before it;
a 2.0 (or 1) file is read with ``[0]`` added by :func:`upgrade_table`.

Each column is documented once, in :data:`COLUMNS`; the docs become Arrow field metadata
(key ``doc``) and so ship inside every Parquet file: ``column_docs(pq.read_schema(path))``
gives them back from a file, and :func:`columns_table` renders them as a text table
(``python -m rollbank.batching.schema``). All columns are non-null except
:data:`NULLABLE` (``current_logprobs``, ``divergence``).

Invariants: the per-token list columns of a row have equal length; rows of one group are
contiguous and ordered by slot; only trainable outcomes appear.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from rollbank.batching.batch import Batch
from rollbank.errors import InputError

SCHEMA_VERSION = "2.1"
READABLE_VERSIONS = ("1", "2")  # major versions this reader accepts (1 is upgraded on read)
SCHEMA_NAME = "rollbank.trajectory_batch"
META_VERSION = b"rollbank.schema_version"
META_NAME = b"rollbank.schema"
META_BATCH = b"rollbank.batch"
META_STALENESS = b"rollbank.staleness"
META_UPGRADED = b"rollbank.upgraded_from"
UNMEASURED = "unmeasured"  # gate_verdict of a row nobody scored

TIMING_FIELDS = (
    "launched_at", "started_at", "finished_at", "duration_s",
    "sandbox_setup_s", "inference_s", "tool_s", "verify_s",
)

DIVERGENCE_FIELDS = (
    "n_tokens", "mean_log_rho", "geo_ratio", "k1", "k3", "k3_sum", "chi2", "ess",
    "max_abs_log_rho",
)
DIVERGENCE_TYPE = pa.struct(
    [pa.field("n_tokens", pa.int32(), nullable=False)]
    + [pa.field(n, pa.float64(), nullable=False) for n in DIVERGENCE_FIELDS[1:]]
)

DOC_KEY = b"doc"

#: (name, type, doc) of every column, in order: the single source of the column docs.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("trajectory_id", pa.string(), "attempt id <group_id>/s<slot>/r<retry>"),
    ("batch_index", pa.int32(), "index of the batch in its collection"),
    ("group_id", pa.string(), "GRPO group"),
    ("group_seq", pa.int32(), "original launch order of the group"),
    ("task_id", pa.string(), "task"),
    ("task_hash", pa.string(), "task content hash (\"\" if unknown)"),
    ("attempt", pa.int16(), "sibling slot within the group"),
    ("retry", pa.int16(), "re-runs of this slot before this attempt"),
    ("seed", pa.int64(), "sampling seed of the attempt"),
    ("token_ids", pa.list_(pa.int32()), "prompt + every turn's model and environment tokens"),
    ("logprobs", pa.list_(pa.float32()), "behaviour log-prob per token (0.0 where mask is 0)"),
    ("policy_versions", pa.list_(pa.int32()), "weight version per token (-1 for env/prompt tokens)"),
    ("loss_mask", pa.list_(pa.int8()), "1: sampled by the model (trainable), 0: prompt/env"),
    ("prompt_len", pa.int32(), "tokens of the initial prompt"),
    ("num_tokens", pa.int32(), "len(token_ids)"),
    ("num_model_tokens", pa.int32(), "sum(loss_mask)"),
    ("reward", pa.float64(), "reward used for the advantage"),
    ("advantage", pa.float32(), "GRPO advantage over the group's valid siblings"),
    ("group_size", pa.int16(), "slots in the group (n)"),
    ("group_valid", pa.int16(), "valid siblings (rows of this group in the batch)"),
    ("zero_variance", pa.bool_(), "all valid rewards of the group equal"),
    ("outcome", pa.string(), "model_success | model_failure"),
    ("reason", pa.string(), "reason code (rollbank.episodes.outcome.Reason)"),
    ("min_version", pa.int32(), "oldest version among model tokens (-1 if none)"),
    ("max_version", pa.int32(), "newest version among tokens (-1 if none)"),
    ("timings", pa.struct([pa.field(n, pa.float64(), nullable=False) for n in TIMING_FIELDS]),
     "seconds: " + ", ".join(TIMING_FIELDS)),
    ("servers", pa.list_(pa.string()), "inference servers that served its turns"),
    ("outcome_json", pa.string(), "the full EpisodeOutcome (evidence) as JSON"),
    # --- version 2: staleness (issue #11; docs/staleness.md) ---
    ("current_logprobs", pa.list_(pa.float32()),
     "current policy's log-prob per token (0.0 where loss_mask is 0); null: unmeasured"),
    ("scorer_version", pa.int32(), "weight version that scored current_logprobs (-1: unmeasured)"),
    ("is_weights", pa.list_(pa.float32()),
     "per-token importance weight of the active correction (0.0 on prompt/env and rejected "
     "tokens; 1.0 on model tokens when unmeasured)"),
    ("is_keep", pa.list_(pa.int8()),
     "1: the token stays in the loss (numerator and normaliser): loss_mask AND the "
     "correction's keep"),
    ("gate_verdict", pa.string(),
     "staleness gate: admit | downweight | exclude (scored after emission) | unmeasured"),
    ("gate_weight", pa.float32(), "the gate's trajectory weight; the loss multiplies is_weights by it"),
    ("gate_reasons", pa.list_(pa.string()), "GateReason values behind the verdict"),
    ("rare_success", pa.bool_(), "kept (down-weighted) instead of dropped: only success of its group"),
    ("stale_retries", pa.int16(), "re-runs of this slot caused by the staleness gate"),
    ("divergence", DIVERGENCE_TYPE,
     "this row's log rho statistics: " + ", ".join(DIVERGENCE_FIELDS) + "; null: unmeasured"),
    # --- version 2.1: segments (docs/chat.md) ---
    ("segment_starts", pa.list_(pa.int32()),
     "token offsets where a segment begins, first 0: a model token in the segment starting at "
     "s was conditioned on tokens s.. only ([0]: one segment)"),
)
MINOR_COLUMNS = ("segment_starts",)  # added in 2.1: a 2.0 file gets them from upgrade_table

V1_COLUMNS = tuple(name for name, _, _ in COLUMNS[: COLUMNS.index(
    next(c for c in COLUMNS if c[0] == "current_logprobs"))])
NULLABLE = frozenset({"current_logprobs", "divergence"})

SCHEMA = pa.schema(
    [pa.field(name, type_, nullable=name in NULLABLE, metadata={DOC_KEY: doc.encode()})
     for name, type_, doc in COLUMNS],
    metadata={META_VERSION: SCHEMA_VERSION.encode(), META_NAME: SCHEMA_NAME.encode()},
)
STALENESS_FIELDS: tuple[pa.Field, ...] = tuple(
    SCHEMA.field(name) for name, _, _ in COLUMNS
    if name not in V1_COLUMNS and name not in MINOR_COLUMNS
)


def column_docs(schema: pa.Schema = SCHEMA) -> dict[str, str]:
    """The ``doc`` of each column of ``schema`` (e.g. read back from a Parquet file)."""
    return {f.name: (f.metadata or {}).get(DOC_KEY, b"").decode() for f in schema}


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list<{t.value_type}>"
    if pa.types.is_struct(t):
        return f"struct<{len(t)} fields>"
    return str(t)


def columns_table(schema: pa.Schema = SCHEMA) -> str:
    """The columns as a plain-text table (name, Arrow type, doc), generated from ``schema``."""
    docs = column_docs(schema)
    rows = [(f.name, _type_name(f.type), docs[f.name]) for f in schema]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return "\n".join(f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows)


class SchemaError(InputError):
    """A table is not a rollbank trajectory batch of a version this code reads (bad input:
    the message names the batch directory or file)."""


def batch_summary(batch: Batch) -> dict[str, Any]:
    """Batch-level facts stored in the schema metadata and the manifest (JSON-ready)."""
    return {
        "index": batch.index,
        "groups": len(batch.groups),
        "trajectories": sum(len(g.trajectories) for g in batch.groups),
        "complete": batch.complete,
        "window_start": batch.window_start,
        "ready_at": batch.ready_at,
        "time_to_batch_s": batch.time_to_batch_s,
        "accounting": batch.accounting.to_dict(),
        "profile": batch.profile.to_dict(),
        "meta": {k: _jsonable(v) for k, v in batch.meta.items()},
    }


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


def neutral_staleness(loss_mask: Sequence[int]) -> dict[str, Any]:
    """Staleness column values of an unmeasured row: weight 1 and keep on its model tokens."""
    keep = [1 if m else 0 for m in loss_mask]
    return {
        "current_logprobs": None, "scorer_version": -1,
        "is_weights": [float(k) for k in keep], "is_keep": keep,
        "gate_verdict": UNMEASURED, "gate_weight": 1.0, "gate_reasons": [],
        "rare_success": False, "stale_retries": 0, "divergence": None,
    }


def _staleness_row(batch: Batch, trajectory_id: str, loss_mask: Sequence[int]) -> dict[str, Any]:
    given = batch.staleness.rows.get(trajectory_id) if batch.staleness is not None else None
    if given is None:
        return neutral_staleness(loss_mask)
    row = dict(given)
    missing = [f.name for f in STALENESS_FIELDS if f.name not in row]
    if missing:
        raise SchemaError(f"{trajectory_id}: staleness values lack {missing}")
    n = len(loss_mask)
    for name in ("current_logprobs", "is_weights", "is_keep"):
        if row[name] is not None and len(row[name]) != n:
            raise SchemaError(f"{trajectory_id}: {name} has {len(row[name])} values, {n} tokens")
    return row


def batch_to_table(batch: Batch) -> pa.Table:
    """One row per trainable trajectory, in group then slot order."""
    cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
    for group, traj, reward, advantage in batch.rows():
        n = len(traj.token_ids)
        if not (len(traj.logprobs) == len(traj.loss_mask) == len(traj.policy_versions) == n):
            raise SchemaError(f"{traj.trajectory_id}: per-token columns differ in length")
        assert traj.outcome is not None  # rows() yields valid siblings only
        row: dict[str, Any] = {
            "trajectory_id": traj.trajectory_id, "batch_index": batch.index,
            "group_id": group.group_id, "group_seq": group.seq, "task_id": group.task_id,
            "task_hash": traj.task_hash, "attempt": traj.attempt, "retry": traj.retry,
            "seed": traj.seed, "token_ids": traj.token_ids, "logprobs": traj.logprobs,
            "policy_versions": traj.policy_versions, "loss_mask": traj.loss_mask,
            "prompt_len": traj.prompt_len, "num_tokens": n,
            "num_model_tokens": traj.num_model_tokens, "reward": reward,
            "advantage": advantage, "group_size": group.size,
            "group_valid": len(group.trajectories), "zero_variance": group.zero_variance,
            "outcome": traj.outcome.outcome.value, "reason": traj.outcome.reason.value,
            "min_version": traj.min_version, "max_version": traj.max_version,
            "timings": {
                "launched_at": traj.launched_at, "started_at": traj.started_at,
                "finished_at": traj.finished_at, "duration_s": traj.duration_s,
                "sandbox_setup_s": traj.sandbox_setup_s, "inference_s": traj.inference_s,
                "tool_s": traj.tool_s, "verify_s": traj.verify_s,
            },
            "servers": list(traj.servers),
            "segment_starts": list(traj.segment_starts) or [0],
            "outcome_json": json.dumps(traj.outcome.to_dict(), sort_keys=True, default=str),
        }
        row.update(_staleness_row(batch, traj.trajectory_id, traj.loss_mask))
        for k, v in row.items():
            cols[k].append(v)
    table = pa.Table.from_pydict(cols, schema=SCHEMA)
    meta = dict(SCHEMA.metadata or {})
    meta[META_BATCH] = json.dumps(batch_summary(batch), sort_keys=True, default=str).encode()
    report = batch.staleness.report if batch.staleness is not None else None
    meta[META_STALENESS] = json.dumps(report, sort_keys=True, default=str).encode()
    return table.replace_schema_metadata(meta)


def schema_version(schema: pa.Schema) -> str:
    """The major schema version of ``schema`` (after checking it is a rollbank batch)."""
    meta = schema.metadata or {}
    if meta.get(META_NAME, b"").decode() != SCHEMA_NAME:
        raise SchemaError("not a rollbank trajectory batch (schema name missing)")
    version = str(meta.get(META_VERSION, b"").decode()).split(".")[0]
    if version not in READABLE_VERSIONS:
        raise SchemaError(f"schema version {version!r}; this reader reads {READABLE_VERSIONS}")
    return version


def check_schema(schema: pa.Schema) -> dict[str, Any]:
    """Validate version and columns; return the batch summary stored in the metadata.

    Version 1 schemas pass with the version-1 columns (see :func:`upgrade_table`)."""
    version = schema_version(schema)
    expected = V1_COLUMNS if version == "1" else [n for n in SCHEMA.names if n not in MINOR_COLUMNS]
    missing = [n for n in expected if n not in schema.names]
    if missing:
        raise SchemaError(f"missing columns: {missing}")
    raw = (schema.metadata or {}).get(META_BATCH)
    summary: dict[str, Any] = json.loads(raw) if raw else {}
    return summary


def staleness_report_of(schema: pa.Schema) -> dict[str, Any] | None:
    """The staleness report stored with a batch (None: unmeasured, or a version-1 file)."""
    raw = (schema.metadata or {}).get(META_STALENESS)
    report: dict[str, Any] | None = json.loads(raw) if raw else None
    return report


def upgrade_table(table: pa.Table) -> pa.Table:
    """A version-1 table with the version-2 staleness columns added (neutral values, see the
    module doc), a 2.0 (or 1) table with ``segment_starts = [0]``, and the metadata marked
    ``rollbank.upgraded_from = <major>``; a 2.1 table unchanged."""
    check_schema(table.schema)
    major = schema_version(table.schema)
    out = table
    if major == "1":
        masks = table.column("loss_mask").to_pylist()
        neutral = [neutral_staleness(m) for m in masks]
        out = table.select(list(V1_COLUMNS))
        for f in STALENESS_FIELDS:
            out = out.append_column(f, pa.array([r[f.name] for r in neutral], type=f.type))
    for name in MINOR_COLUMNS:
        if name not in out.schema.names:
            f = SCHEMA.field(name)
            out = out.append_column(f, pa.array([[0]] * out.num_rows, type=f.type))
    if out is table:
        return table
    meta = dict(table.schema.metadata or {})
    meta[META_VERSION] = SCHEMA_VERSION.encode()
    meta[META_UPGRADED] = major.encode()
    return out.replace_schema_metadata(meta)


if __name__ == "__main__":
    print(columns_table())
