"""Schema v2: staleness columns round-trip through the batch directory; v1 directories load."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rollbank.batching.advantages import grpo_advantages
from rollbank.batching.batch import (
    Batch,
    BatchAccounting,
    DistStats,
    GroupResult,
    SelectionProfile,
    StalenessColumns,
)
from rollbank.batching.config import AdvantageConfig
from rollbank.batching.loader import read_batch_dir, table_to_tensors
from rollbank.batching.schema import (
    COLUMNS,
    META_UPGRADED,
    META_VERSION,
    MINOR_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    STALENESS_FIELDS,
    V1_COLUMNS,
    SchemaError,
    batch_to_table,
    check_schema,
    staleness_report_of,
)
from rollbank.batching.writer import MANIFEST_NAME, PARQUET_NAME, write_batch
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.staleness import rows as staleness_rows
from rollbank.staleness.config import CorrectionConfig, CorrectionMode, StalenessConfig
from rollbank.staleness.gate import StalenessGate
from rollbank.staleness.rows import score_batch

pytest.importorskip("torch")

# per slot: behaviour log-probs of its two model tokens; the current policy adds DELTAS
BEHAVIOUR = ([-1.0, -2.0], [-0.5, -0.25], [-1.5, -1.0])
DELTAS = ([math.log(3.0), 0.0], [-0.1, 0.1], [0.0, 0.0])


def _traj(slot: int) -> Trajectory:
    t = Trajectory(trajectory_id=f"g0/s{slot}/r0", group_id="g0", task_id="t", attempt=slot)
    t.append_prompt([5, 6, 7])
    t.prompt_len = 3
    t.append_model([10 + slot, 11], BEHAVIOUR[slot], 3)
    t.append_prompt([8])
    reward = 1.0 if slot == 0 else 0.0
    t.outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS if reward else Reason.VERIFIED_FAIL,
                                  reward=reward)
    return t


def make_batch() -> Batch:
    trajs = tuple(_traj(s) for s in range(3))
    adv = grpo_advantages([1.0, 0.0, 0.0], AdvantageConfig())
    group = GroupResult("g0", "t", 0, trajs, adv.rewards, adv.advantages, adv.zero_variance,
                        3, 0, 0, 0.0, 1.0)
    d = DistStats(1, 1.0, 1.0, 1.0, 1.0)
    return Batch(0, (group,), BatchAccounting(3, 3, 0, 0, 0, 0),
                 SelectionProfile(d, d, d, d, 0.5, 0.5, 0, d), 0.0, 1.0, True)


def current_logprobs(batch: Batch, measured: set[int]) -> dict[str, list[float] | None]:
    out: dict[str, list[float] | None] = {}
    for t in batch.trajectories:
        if t.attempt not in measured:
            out[t.trajectory_id] = None
            continue
        cur = [0.0] * len(t.token_ids)
        for j, (b, d) in enumerate(zip(BEHAVIOUR[t.attempt], DELTAS[t.attempt], strict=True)):
            cur[3 + j] = b + d
        out[t.trajectory_id] = cur
    return out


def test_schema_v2_documents_every_staleness_column() -> None:
    assert SCHEMA_VERSION.split(".")[0] == "2"
    names = [f.name for f in STALENESS_FIELDS]
    assert names == ["current_logprobs", "scorer_version", "is_weights", "is_keep",
                     "gate_verdict", "gate_weight", "gate_reasons", "rare_success",
                     "stale_retries", "divergence"]
    assert staleness_rows.STALENESS_FIELDS == STALENESS_FIELDS  # one definition
    docs = {n: d for n, _, d in COLUMNS}
    assert all(docs[n] for n in names)
    assert [f.name for f in SCHEMA if f.nullable] == ["current_logprobs", "divergence"]
    assert list(V1_COLUMNS) + names + list(MINOR_COLUMNS) == SCHEMA.names


def test_round_trip_without_current_logprobs_has_neutral_values(tmp_path: Path) -> None:
    path = write_batch(tmp_path, make_batch())
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    assert manifest["schema_version"] == SCHEMA_VERSION and manifest["staleness_report"] is None
    table = read_batch_dir(path)
    assert table.column("current_logprobs").null_count == 3
    assert table.column("divergence").null_count == 3
    assert set(table.column("gate_verdict").to_pylist()) == {"unmeasured"}
    assert table.column("scorer_version").to_pylist() == [-1, -1, -1]
    assert table.column("is_keep").to_pylist() == table.column("loss_mask").to_pylist()
    assert table.column("is_weights").to_pylist()[0] == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    tb = table_to_tensors(table)
    assert tb.current_logprobs is None and tb.measured is not None and not tb.measured.any()
    assert tb.is_weights is not None and tb.is_keep is not None and tb.gate_weight is not None
    assert (tb.is_weights == tb.loss_mask).all() and (tb.is_keep == tb.loss_mask).all()
    assert tb.gate_weight.tolist() == [1.0, 1.0, 1.0]


def test_round_trip_with_current_logprobs(tmp_path: Path) -> None:
    cfg = StalenessConfig(correction=CorrectionConfig(mode=CorrectionMode.TOKEN_TIS, tis_cap=2.0))
    scoring = score_batch(make_batch(), current_logprobs(make_batch(), {0, 1}),
                          current_version=5, config=cfg, gate=StalenessGate())
    path = write_batch(tmp_path, scoring.batch)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    report = manifest["staleness_report"]
    assert report == json.loads(json.dumps(scoring.report))
    assert report["scorer"] == "trainer_recompute" and report["current_version"] == 5
    assert report["divergence"]["version_lag_histogram"] == {"2": 4}
    table = read_batch_dir(path)
    assert staleness_report_of(table.schema) == report
    rows = {r["trajectory_id"]: r for r in table.to_pylist()}
    r0, r1, r2 = rows["g0/s0/r0"], rows["g0/s1/r0"], rows["g0/s2/r0"]
    # slot 0: rho = (3, 1) -> TIS weights (2, 1); its k3 is large but it is the only success
    assert r0["is_weights"] == pytest.approx([0, 0, 0, 2.0, 1.0, 0])
    assert r0["current_logprobs"] == pytest.approx([0, 0, 0, -1 + math.log(3), -2, 0])
    assert r0["rare_success"] and r0["gate_verdict"] == "downweight" and r0["scorer_version"] == 5
    k3 = (2.0 - math.log(3.0)) / 2  # mean of (rho - 1 - log rho) over (3, 1)
    assert r0["divergence"]["k3"] == pytest.approx(k3) and r0["divergence"]["n_tokens"] == 2
    assert r1["is_weights"] == pytest.approx([0, 0, 0, math.exp(-0.1), math.exp(0.1), 0])
    assert r2["current_logprobs"] is None and r2["gate_verdict"] == "admit"
    assert r2["gate_reasons"] == ["unmeasured"] and r2["scorer_version"] == -1
    tb = table_to_tensors(table)
    assert tb.measured is not None and tb.measured.tolist() == [True, True, False]
    assert tb.current_logprobs is not None
    assert tb.current_logprobs[2].abs().sum().item() == 0.0
    assert tb.current_logprobs[0, 3].item() == pytest.approx(-1 + math.log(3), abs=1e-6)
    assert tb.gate_weight is not None and tb.gate_weight[0].item() == pytest.approx(r0["gate_weight"])
    assert tb.correction_mode == "token_tis"


def test_a_gate_drop_after_emission_excludes_the_row(tmp_path: Path) -> None:
    batch = make_batch()
    cur = current_logprobs(batch, {0, 1, 2})
    cur["g0/s1/r0"] = [0.0, 0.0, 0.0, -0.5 - 1.0, -0.25 + 1.0, 0.0]  # far off, a failure
    scoring = score_batch(batch, cur, current_version=4, gate=StalenessGate())
    table = read_batch_dir(write_batch(tmp_path, scoring.batch))
    row = table.to_pylist()[1]
    assert row["gate_verdict"] == "exclude" and row["gate_weight"] == 0.0
    assert row["is_keep"] == [0] * 6 and row["is_weights"] == [0.0] * 6
    assert scoring.report["dropped"][0]["trajectory_id"] == "g0/s1/r0"
    tb = table_to_tensors(table)
    assert tb.is_keep is not None and tb.is_keep[1].sum().item() == 0.0


def _write_v1(root: Path, batch: Batch) -> Path:
    """A batch directory exactly as the version-1 writer made it."""
    v2 = batch_to_table(batch)
    meta = dict(v2.schema.metadata)
    meta[META_VERSION] = b"1"
    for key in list(meta):
        if key == b"rollbank.staleness":
            del meta[key]
    v1 = v2.select(list(V1_COLUMNS)).replace_schema_metadata(meta)
    d = root / "batch-000000"
    d.mkdir(parents=True)
    pq.write_table(v1, d / PARQUET_NAME)
    digest = hashlib.sha256((d / PARQUET_NAME).read_bytes()).hexdigest()
    (d / MANIFEST_NAME).write_text(json.dumps({
        "schema": "rollbank.trajectory_batch", "schema_version": "1", "rows": v1.num_rows,
        "files": {PARQUET_NAME: {"sha256": digest}}, "batch": {}, "extra": {}}))
    return d


def test_a_version_1_directory_still_loads_with_neutral_values(tmp_path: Path) -> None:
    d = _write_v1(tmp_path, make_batch())
    raw = pq.read_table(d / PARQUET_NAME)
    assert "is_weights" not in raw.schema.names
    table = read_batch_dir(d)
    assert table.schema.names == SCHEMA.names
    assert table.schema.metadata[META_UPGRADED] == b"1"
    assert set(table.column("gate_verdict").to_pylist()) == {"unmeasured"}
    tb = table_to_tensors(raw)  # the raw v1 table converts too
    assert tb.is_weights is not None and tb.is_keep is not None and tb.gate_weight is not None
    assert (tb.is_weights == tb.loss_mask).all() and (tb.is_keep == tb.loss_mask).all()
    assert tb.gate_weight.tolist() == [1.0, 1.0, 1.0] and tb.current_logprobs is None


def test_v1_missing_a_v1_column_and_v2_missing_a_v2_column_are_refused() -> None:
    v2 = batch_to_table(make_batch())
    meta = dict(v2.schema.metadata)
    meta[META_VERSION] = b"1"
    v1 = v2.select([n for n in V1_COLUMNS if n != "loss_mask"]).replace_schema_metadata(meta)
    with pytest.raises(SchemaError, match="loss_mask"):
        check_schema(v1.schema)
    no_keep = v2.drop_columns(["is_keep"])
    with pytest.raises(SchemaError, match="is_keep"):
        check_schema(no_keep.schema)


def test_staleness_values_of_wrong_length_are_refused() -> None:
    batch = make_batch()
    scoring = score_batch(batch, current_logprobs(batch, {0}), current_version=3)
    rows = dict(scoring.batch.staleness.rows)  # type: ignore[union-attr]
    rows["g0/s0/r0"] = {**rows["g0/s0/r0"], "is_weights": [1.0]}
    bad = replace(batch, staleness=StalenessColumns(rows, None))
    with pytest.raises(SchemaError, match="is_weights"):
        batch_to_table(bad)
