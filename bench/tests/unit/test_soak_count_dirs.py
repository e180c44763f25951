"""`soak.count_dirs` (the cgroup count of a soak sample) under continuous collection: a
sandbox's cgroup removed between being listed and being walked is skipped, not an error.
Regression: the first fault-soak trial died with FileNotFoundError from ``Path.rglob`` when a
sandbox cgroup went away mid-walk (sampling now happens while work is in flight)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from rollbank_bench.soak_probe import count_dirs


def _tree(root: Path) -> Path:
    for d in ("a/x", "a/y", "b", "c/z/w"):
        (root / "top" / d).mkdir(parents=True)
    (root / "top" / "a" / "file").write_text("not a dir")
    return root / "top"


def test_counts_every_directory_below_top(tmp_path: Path) -> None:
    assert count_dirs(_tree(tmp_path)) == 7  # a, a/x, a/y, b, c, c/z, c/z/w
    assert count_dirs(tmp_path / "missing") == 0


def test_a_directory_removed_mid_walk_is_skipped(tmp_path: Path) -> None:
    top = _tree(tmp_path)
    removed: list[str] = []

    def racing_scandir(path: Path) -> Any:
        # the group goes away after its parent listed it, just before it is walked
        if Path(path).name == "c" and not removed:
            shutil.rmtree(path)
            removed.append(str(path))
        return os.scandir(path)

    assert count_dirs(top, racing_scandir) == 5  # a, a/x, a/y, b, c (listed, then gone)
    assert removed
