"""Reaping the sandbox cgroups of orchestrators that died without cleaning up.

Runs synchronously at backend start, in a worker thread (``LocalBackend._ensure_ready`` via
``asyncio.to_thread``), so its waits never block the event loop. Only groups whose owner
process is known dead (``owner_alive``) are touched.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from rollbank.sandbox.local.cgroups import (
    ROOT,
    V1_CONTROLLERS,
    _own_path,
    _rmtree_cgroup,
    owner_alive,
)


def _kill_v2(group: Path) -> None:
    """Blocking kill of a v2 group: only for the sync reaper (run off the event loop)."""
    kill = group / "cgroup.kill"
    if not kill.exists():
        return
    with contextlib.suppress(OSError):
        kill.write_text("1")
    for _ in range(2000):
        try:
            if "populated 0" in (group / "cgroup.events").read_text():
                return
        except OSError:
            return
        time.sleep(0.0005)


def reap_dead_owners() -> int:
    """Kill and remove sandbox groups of orchestrators that died; return groups reaped."""
    reaped = 0
    hierarchies: list[tuple[Path, bool]] = []
    if (ROOT / "cgroup.controllers").exists():
        hierarchies.append((ROOT / "rollbank", True))
    else:
        if (ROOT / "unified" / "cgroup.procs").exists():
            hierarchies.append((ROOT / "unified" / _own_path(None).lstrip("/") / "rollbank", True))
        for ctrl in (*V1_CONTROLLERS, "freezer"):
            hierarchies.append((ROOT / ctrl / _own_path(ctrl).lstrip("/") / "rollbank", False))
    for base, is_v2 in hierarchies:
        if not base.is_dir():
            continue
        for owner in base.iterdir():
            if not owner.is_dir() or not owner.name.startswith("o") or owner_alive(owner.name):
                continue
            for sb in [p for p in owner.iterdir() if p.is_dir()]:
                if is_v2:
                    _kill_v2(sb)
                else:
                    with contextlib.suppress(OSError):
                        (sb / "freezer.state").write_text("THAWED")
                    for f in sb.rglob("cgroup.procs"):
                        with contextlib.suppress(OSError, ValueError):
                            for pid in f.read_text().split():
                                os.kill(int(pid), 9)
                reaped += 1
            _rmtree_cgroup(owner)
    return reaped
