"""The full-range id mapping's command line (pure: no process is started)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.runtime import IdMapping, init_argv, mapped_stage


def test_a_full_range_sandbox_is_mapped_by_rb_helper_before_bwrap_goes_on(tmp_path: Path) -> None:
    base, mnt = tmp_path / "base", tmp_path / "mnt"
    for d in (base, mnt):
        d.mkdir()
    kw = dict(procs_files=[], mount_dir=mnt, layers=[base], storage_mb=64, rlimits="",
              bwrap="/usr/bin/bwrap", hostname="h", network=False, helper=Path("/h"))
    one = IdMapping(100000, 65536, userns_fd=7)
    full = dataclasses.replace(one, full=True)
    stage = mapped_stage(mnt, "/usr/bin/bwrap")
    argv = init_argv(mapping=full, **kw)  # type: ignore[arg-type]
    assert argv[8] == f"100000 7 {stage} 65536\n{base}\n{mnt}/l0"  # COUNT: rb-helper maps 0..65535
    bw = argv[argv.index("--") + 1:]
    assert "--disable-userns" not in bw  # bwrap refuses it with a block fd: the mapper does it
    assert bw[bw.index("--userns-block-fd") + 1] == "@BLOCKFD@"
    assert bw[bw.index("--info-fd") + 1] == "@INFOFD@" and "--assert-userns-disabled" in bw
    old = init_argv(mapping=one, **kw)  # type: ignore[arg-type]
    assert old[8] == f"100000 7 {stage}\n{base}\n{mnt}/l0" and "--disable-userns" in old
    assert "--userns-block-fd" not in old
    off = init_argv(**kw)  # type: ignore[arg-type]
    assert "--disable-userns" in off and off[8] == "-"
    assert LocalSandboxConfig().userns_full_range is True  # the default
