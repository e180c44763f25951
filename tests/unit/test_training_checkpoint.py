"""Versioned weight directories are published atomically (complete or absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.training.checkpoint import (
    LATEST_NAME,
    copy_tokenizer,
    latest_version,
    read_meta,
    version_dir_name,
    write_version,
)


def test_versions_are_written_once_and_latest_follows(tmp_path: Path) -> None:
    assert latest_version(tmp_path) is None
    v1 = write_version(tmp_path, 1, lambda d: (d / "model.safetensors").write_text("a"), {"kind": "full"})
    v2 = write_version(tmp_path, 2, lambda d: (d / "model.safetensors").write_text("b"), {"kind": "full"})
    assert v1.name == version_dir_name(1) == "v000001" and latest_version(tmp_path) == 2
    assert read_meta(v2) == {"kind": "full", "version": 2}
    assert (v1 / "model.safetensors").read_text() == "a"
    with pytest.raises(FileExistsError):
        write_version(tmp_path, 2, lambda d: None, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST_NAME, "v000001", "v000002"]


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    write_version(tmp_path, 1, lambda d: (d / "x").write_text("ok"), {})

    def half(tmp: Path) -> None:
        (tmp / "model.safetensors").write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_version(tmp_path, 2, half, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST_NAME, "v000001"]
    assert latest_version(tmp_path) == 1


def test_negative_version_and_tokenizer_copy(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        version_dir_name(-1)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "tokenizer.json").write_text("{}")
    (src / "model.safetensors").write_text("w")
    copy_tokenizer(src, dst)
    assert [p.name for p in dst.iterdir()] == ["tokenizer.json"]
