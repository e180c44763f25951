"""Fuzzed files a reader loads: batch directories and episode files (issue #13, item 3).

Batch directories written by the real writer are corrupted (parquet truncated, bytes flipped,
garbage, deleted; manifest truncated or rewritten) or rewritten consistently (checksum
recomputed) with rows that contradict themselves. ``read_batch_dir`` returns the table as
written or raises :class:`BatchFileError` naming the file; it never hands a trainer a table
whose rows are inconsistent (lists not ``num_tokens`` long, NaN log-probs, wrong types).

Episode files (JSON an operator hands to ``rollbank replay``) are mutated the same way:
:func:`load_episode` returns an :class:`EpisodeFile` or raises an :class:`InputError` naming the
file.

``ROLLBANK_FUZZ_EXAMPLES=N`` raises the number of examples (the longer campaign).
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import math
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_batching_schema import make_batch

from rollbank.batching.loader import BatchFileError, read_batch_dir
from rollbank.batching.schema import SchemaError
from rollbank.batching.writer import MANIFEST_NAME, PARQUET_NAME, write_batch
from rollbank.episodes.episode_file import SCHEMA as EPISODE_SCHEMA
from rollbank.episodes.episode_file import EpisodeFile
from rollbank.episodes.replay import load_episode
from rollbank.errors import InputError

FUZZ = int(os.environ.get("ROLLBANK_FUZZ_EXAMPLES", "0"))


def budget(n: int) -> settings:
    return settings(max_examples=FUZZ or n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@cache
def template() -> Path:
    root = Path(tempfile.mkdtemp(prefix="rollbank-fuzz-batch-"))
    atexit.register(shutil.rmtree, root, True)
    return write_batch(root, make_batch())


def fresh(tmp: Path) -> Path:
    dst = tmp / "batch-000000"
    shutil.copytree(template(), dst)
    return dst


def check_table(table: pa.Table) -> None:
    """What a trainer relies on, checked independently of the loader's own checks."""
    for row in table.to_pylist():
        n = row["num_tokens"]
        for name in ("token_ids", "logprobs", "policy_versions", "loss_mask", "is_weights", "is_keep"):
            assert row[name] is not None and len(row[name]) == n, name
        assert all(math.isfinite(x) for x in row["logprobs"])
        assert math.isfinite(row["advantage"]) and math.isfinite(row["reward"])


Corruption = tuple[str, int, bytes]
CORRUPTION = st.tuples(
    st.sampled_from(["truncate", "flip", "append", "replace", "delete", "zero"]),
    st.integers(min_value=0, max_value=1 << 20),
    st.binary(min_size=1, max_size=16),
)


def corrupt(path: Path, c: Corruption) -> None:
    kind, at, data = c
    if not path.exists():
        return
    raw = bytearray(path.read_bytes())
    pos = at % (len(raw) + 1)
    if kind == "truncate":
        raw = raw[:pos]
    elif kind == "flip" and raw:
        for i, b in enumerate(data):
            raw[(pos + i) % len(raw)] ^= b or 0xFF
    elif kind == "append":
        raw += data
    elif kind == "replace":
        raw = bytearray(data)
    elif kind == "zero":
        raw[pos:pos + len(data)] = bytes(len(raw[pos:pos + len(data)]))
    elif kind == "delete":
        path.unlink()
        return
    path.write_bytes(bytes(raw))


@budget(60)
@given(st.lists(st.tuples(st.sampled_from([PARQUET_NAME, MANIFEST_NAME]), CORRUPTION), min_size=1,
                max_size=3), st.booleans())
@example([(MANIFEST_NAME, ("truncate", 10, b"x"))], True)  # was: JSONDecodeError
@example([(MANIFEST_NAME, ("replace", 0, b"[]"))], True)  # was: TypeError
@example([(PARQUET_NAME, ("truncate", 100, b"x"))], False)  # was: ArrowInvalid
@example([(PARQUET_NAME, ("delete", 0, b"x"))], True)  # was: FileNotFoundError
@example([(PARQUET_NAME, ("flip", 2193, b"\x00"))], False)  # was: invalid UTF-8 reached the trainer
def test_corrupt_batch_dir_is_a_batch_file_error(corruptions: list[tuple[str, Corruption]],
                                                 verify: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = fresh(Path(tmp))
        original = pq.read_table(path / PARQUET_NAME)
        before = (path / PARQUET_NAME).read_bytes()
        for name, c in corruptions:
            corrupt(path / name, c)
        try:
            table = read_batch_dir(path, verify=verify)
        except BatchFileError as exc:
            assert exc.file is not None and Path(exc.file).parent == path
            assert isinstance(exc, SchemaError) and isinstance(exc, InputError)
            return
        parquet = path / PARQUET_NAME
        if verify or parquet.read_bytes() == before:
            assert parquet.read_bytes() == before  # a changed parquet never passes the checksum
            assert table.equals(original)
        check_table(table)


def rewrite(path: Path, table: pa.Table) -> None:
    """Another writer (or a buggy one): a table with a checksum that matches it."""
    pq.write_table(table, path / PARQUET_NAME)
    manifest = json.loads((path / MANIFEST_NAME).read_text())
    manifest["files"][PARQUET_NAME]["sha256"] = hashlib.sha256((path / PARQUET_NAME).read_bytes()).hexdigest()
    manifest["rows"] = table.num_rows
    (path / MANIFEST_NAME).write_text(json.dumps(manifest))


def _set_cell(table: pa.Table, column: str, row: int, value: Any) -> pa.Table:
    i = table.schema.get_field_index(column)
    values = table.column(column).to_pylist()
    values[row % len(values)] = value
    return table.set_column(i, table.schema.field(i), pa.array(values, type=table.schema.field(i).type))


ROW_EDITS = st.sampled_from([
    ("num_tokens", 10**6), ("num_tokens", -1), ("num_tokens", 0), ("token_ids", [1, 2]),
    ("logprobs", "nan"), ("logprobs", "short"), ("loss_mask", None), ("advantage", math.nan),
    ("reward", math.inf), ("gate_weight", math.nan), ("is_weights", "short"), ("token_ids", "str-type"),
])


@budget(40)
@given(st.lists(st.tuples(ROW_EDITS, st.integers(0, 10)), min_size=1, max_size=3))
@example([(("logprobs", "nan"), 0)])  # was: a NaN behaviour log-prob reached the trainer
@example([(("num_tokens", 10**6), 0)])  # was: accepted; lists shorter than num_tokens
@example([(("token_ids", "str-type"), 0)])  # was: accepted with a string column
def test_self_contradicting_rows_are_refused(edits: list[tuple[tuple[str, Any], int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = fresh(Path(tmp))
        table = pq.read_table(path / PARQUET_NAME)
        for (column, value), row in sorted(edits, key=lambda e: e[0][1] == "str-type"):  # type change last
            cell = table.column(column).to_pylist()[row % table.num_rows]
            if value == "nan":
                table = _set_cell(table, column, row, [math.nan] * len(cell))
            elif value == "short":
                table = _set_cell(table, column, row, cell[:-1])
            elif value == "str-type":
                i = table.schema.get_field_index(column)
                as_text = [[str(x) for x in r] for r in table.column(column).to_pylist()]
                table = table.set_column(i, table.schema.field(i).with_type(pa.list_(pa.string())),
                                         pa.array(as_text, type=pa.list_(pa.string())))
            elif column == "loss_mask" and value is None:
                table = _set_cell(table, column, row, None)
            else:
                table = _set_cell(table, column, row, value)
        rewrite(path, table)
        try:
            loaded = read_batch_dir(path)
        except BatchFileError as exc:
            assert exc.file == str(path / PARQUET_NAME)
            return
        check_table(loaded)


# ------------------------------------------------------------------ episode files
EPISODE: dict[str, Any] = {
    "schema": EPISODE_SCHEMA, "trajectory_id": "g0/s0/r0", "group_id": "g0", "task_id": "t",
    "task_path": "/tasks/t", "task_hash": "ab", "layer_hashes": ["l1"], "seed": 3,
    "harness": "fenced-shell", "workdir": "/app",
    "runner": {"step_timeout_s": 30.0, "use_shell": True, "episode_budget_s": None},
    "steps": [{"index": 0, "model_text": "```bash\nls\n```", "action": "ls", "observation": "x",
               "exit_code": 0, "timed_out": False}],
    "task_steps": [],
    "outcome": {"outcome": "model_success", "reason": "verified_pass", "reward": 1.0,
                "rewards": {"reward": 1.0}, "evidence": {"loop_end": "done"}},
}
EPISODE_PATHS: list[tuple[Any, ...]] = [
    (), ("schema",), ("seed",), ("steps",), ("steps", 0), ("steps", 0, "index"), ("steps", 0, "model_text"),
    ("runner",), ("runner", "step_timeout_s"), ("outcome",), ("outcome", "reason"), ("outcome", "outcome"),
    ("outcome", "reward"), ("outcome", "rewards"), ("outcome", "evidence"), ("task_steps",), ("layer_hashes",),
]
LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
                 st.sampled_from(["verified_pass", "sandbox_died", "model_failure", EPISODE_SCHEMA]))
VALUE = st.recursive(LEAF, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                                max_size=3), max_leaves=8)
DELETE = object()


def _mutate(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return doc if value is DELETE else value
    node = doc
    try:
        for key in path[:-1]:
            node = node[key]
        if value is DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass
    return doc


@budget(150)
@given(st.lists(st.tuples(st.sampled_from(EPISODE_PATHS), VALUE | st.just(DELETE)), max_size=4),
       st.none() | st.floats(0.0, 0.999), st.none() | st.binary(max_size=40))
@example([(("runner", "step_timeout_s"), math.nan)], None, None)  # NaN limits must not replay
@example([(("outcome", "reward"), math.inf)], None, None)
def test_episode_file_loads_or_names_the_file(mutations: list[tuple[tuple[Any, ...], Any]],
                                              cut: float | None, raw: bytes | None) -> None:
    doc = copy.deepcopy(EPISODE)
    for p, v in mutations:
        doc = _mutate(doc, p, v)
    data = raw if raw is not None else json.dumps(doc).encode()
    if cut is not None:
        data = data[: int(len(data) * cut)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ep.json"
        path.write_bytes(data)
        try:
            rec = load_episode(path)
        except InputError as exc:
            assert exc.file == str(path)
            return
    assert isinstance(rec, EpisodeFile)
    assert math.isfinite(rec.runner.step_timeout_s) and rec.runner.step_timeout_s > 0
    if rec.outcome is not None:
        rec.outcome.to_outcome()
        assert rec.outcome.reward is None or math.isfinite(rec.outcome.reward)


# ------------------------------------------------------------ regressions (minimal examples)
@pytest.mark.parametrize("name, data", [
    (MANIFEST_NAME, b'{"rows": 5, "files": {'),  # truncated manifest: was JSONDecodeError
    (MANIFEST_NAME, b"[]"),  # was TypeError
    (MANIFEST_NAME, b'{"rows": 5}'),  # was KeyError
    (PARQUET_NAME, b"PAR1"),  # truncated parquet (verify=False): was ArrowInvalid
])
def test_unreadable_batch_files_name_the_file(tmp_path: Path, name: str, data: bytes) -> None:
    path = fresh(tmp_path)
    (path / name).write_bytes(data)
    with pytest.raises(BatchFileError) as info:
        read_batch_dir(path, verify=False)
    assert info.value.file == str(path / name)


def test_missing_parquet_is_a_batch_file_error(tmp_path: Path) -> None:  # was FileNotFoundError
    path = fresh(tmp_path)
    (path / PARQUET_NAME).unlink()
    with pytest.raises(BatchFileError):
        read_batch_dir(path)


def test_nan_logprob_row_is_refused_even_with_a_matching_checksum(tmp_path: Path) -> None:
    path = fresh(tmp_path)
    table = pq.read_table(path / PARQUET_NAME)
    n = len(table.column("logprobs").to_pylist()[0])
    rewrite(path, _set_cell(table, "logprobs", 0, [math.nan] * n))
    with pytest.raises(BatchFileError, match="non-finite"):
        read_batch_dir(path)


def test_short_token_list_is_refused(tmp_path: Path) -> None:
    path = fresh(tmp_path)
    table = pq.read_table(path / PARQUET_NAME)
    rewrite(path, _set_cell(table, "num_tokens", 0, 10**6))
    with pytest.raises(BatchFileError, match="num_tokens"):
        read_batch_dir(path)


@pytest.mark.parametrize("path, value", [
    (("outcome", "reward"), math.inf),  # was: loaded, an infinite reward
    (("runner", "step_timeout_s"), math.inf),  # was: loaded, replay without a step timeout
    (("outcome", "rewards"), {"reward": math.nan}),  # was: loaded, a NaN named reward
])
def test_non_finite_episode_numbers_name_the_field(tmp_path: Path, path: tuple[Any, ...], value: Any) -> None:
    doc = _mutate(copy.deepcopy(EPISODE), path, value)
    file = tmp_path / "ep.json"
    file.write_text(json.dumps(doc))
    with pytest.raises(InputError) as info:
        load_episode(file)
    assert info.value.file == str(file) and (info.value.field or "").startswith(".".join(map(str, path)))
