"""The JSONL event log is repaired on open after a crash (torn or unparseable last line)."""

from __future__ import annotations

import json
from pathlib import Path

from rollbank.metrics.events import EventLog, read_events, repair_log


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line parses


def _log_with(path: Path, n: int) -> None:
    with EventLog(path) as log:
        for i in range(n):
            log.record("tick", float(i), i=i)


def test_a_torn_last_line_is_cut_and_recorded_on_open(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _log_with(path, 3)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind": "finished", "t": 1.5, "key"')  # killed mid-write
    with EventLog(path, now=lambda: 7.0) as log:
        assert log.repair is not None and log.repair["cut_bytes"] == 36
        log.record("after", 8.0)
    events = _lines(path)
    assert [e["kind"] for e in events] == ["collector.tick"] * 3 + [
        "collector.log_repaired", "collector.after"]
    repaired = events[3]
    assert repaired["t"] == 7.0 and repaired["kept_bytes"] == len(whole)
    assert str(repaired["cut_prefix"]).startswith('{"kind": "finished"')


def test_a_whole_log_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _log_with(path, 2)
    before = path.read_bytes()
    assert repair_log(path) is None and path.read_bytes() == before
    with EventLog(path) as log:
        assert log.repair is None
    assert [e["kind"] for e in read_events(path)] == ["collector.tick"] * 2
    assert repair_log(tmp_path / "absent.jsonl") is None


def test_a_complete_but_garbage_last_line_is_cut(tmp_path: Path) -> None:
    """A power loss can leave a block of zeros that ends in a newline-free run, or garbage
    ending in a newline; both are cut and every kept line parses."""
    path = tmp_path / "events.jsonl"
    _log_with(path, 2)
    whole = path.read_bytes()
    path.write_bytes(whole + b"\x00" * 100 + b"\n")
    info = repair_log(path)
    assert info is not None and info["cut_bytes"] == 101
    assert path.read_bytes() == whole
    path.write_bytes(whole + b"\x00" * 100)
    assert repair_log(path) is not None and path.read_bytes() == whole


def test_a_log_that_is_only_a_torn_line_becomes_empty(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"kind": "lau')
    with EventLog(path, now=lambda: 0.0):
        pass
    assert [e["kind"] for e in _lines(path)] == ["collector.log_repaired"]


def test_a_torn_line_longer_than_a_read_chunk_is_found(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _log_with(path, 1)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind": "x", "pad": "' + b"a" * 200_000)
    info = repair_log(path)
    assert info is not None and path.read_bytes() == whole
