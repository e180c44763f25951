"""The soak's mount-table lines (what a round-end diff against the baseline names)."""

from __future__ import annotations

from pathlib import Path

from rollbank_bench.soak_probe import mount_points, sample


def test_mount_points_name_every_counted_mount() -> None:
    lines = mount_points()
    assert len(lines) == sample(lambda: 0)["mounts"]
    assert len(lines) == len(Path("/proc/self/mountinfo").read_text().splitlines())
    root = next(ln for ln in lines if ln.split()[0] == "/")
    assert len(root.split()) == 3  # mount point, fstype, source
    assert any(ln.split()[:2] == ["/proc", "proc"] for ln in lines)
