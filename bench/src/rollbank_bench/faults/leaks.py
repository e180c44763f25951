"""What a campaign must not leave behind: processes, cgroups, mounts, fds, sandbox dirs.

Counted for *this* process only (other collections may run on the host): descendant
processes, sandbox cgroups under this process's owner tag, host mounts under the sandbox
run dir, open file descriptors, and this owner's folder in the sandbox run dir.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rollbank.sandbox.local.cgroups import owner_tag
from rollbank.sandbox.local.config import LocalSandboxConfig

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Snapshot:
    processes: tuple[str, ...]
    cgroups: tuple[str, ...]
    mounts: tuple[str, ...]
    fds: int
    owner_dirs: tuple[str, ...]


def descendants(pid: int | None = None) -> list[str]:
    """``pid cmd`` of every live descendant of ``pid`` (default: this process)."""
    root = os.getpid() if pid is None else pid
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if rest[0] == "Z":
            continue
        parent[int(d.name)], names[int(d.name)] = int(rest[1]), name
    out, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p:
                out.append(f"{c} {names[c]}")
                frontier.append(c)
    return sorted(out)


def owner_cgroup_dirs(tag: str | None = None) -> list[Path]:
    """This process's rollbank owner dirs that exist (one per v1 controller, or v2)."""
    tag = tag or owner_tag()
    out: set[Path] = set()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        names = ["unified"] if not ctrls else [c for c in ctrls.split(",") if not c.startswith("name=")]
        for ctrl in names or []:
            own = CGROUP_ROOT / ctrl / path.lstrip("/") / "rollbank" / tag
            if own.is_dir():
                out.add(own)
    return sorted(out)


def sandbox_cgroups(tag: str | None = None) -> list[str]:
    """Sandbox cgroups left under this process's owner dirs (v1 controllers and v2)."""
    out: list[str] = []
    for own in owner_cgroup_dirs(tag):
        out += [str(p) for p in own.iterdir() if p.is_dir()]
    return sorted(set(out))


def snapshot(config: LocalSandboxConfig | None = None) -> Snapshot:
    cfg = config or LocalSandboxConfig()
    run_dir = str(cfg.run_dir.resolve())
    mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
              if ln.split()[4].startswith(run_dir)]
    owner = cfg.run_dir / owner_tag()
    owner_dirs = [str(p) for p in owner.rglob("*")] if owner.is_dir() else []
    return Snapshot(tuple(descendants()), tuple(sandbox_cgroups()), tuple(mounts),
                    len(list(Path("/proc/self/fd").iterdir())), tuple(d for d in owner_dirs if "/snapshots/" in d))


def leaked(before: Snapshot, after: Snapshot) -> dict[str, object]:
    """What ``after`` has that ``before`` did not (counts, and up to 10 names each)."""
    out: dict[str, object] = {}
    for name in ("processes", "cgroups", "mounts", "owner_dirs"):
        new = sorted(set(getattr(after, name)) - set(getattr(before, name)))
        out[name] = len(new)
        if new:
            out[f"{name}_examples"] = new[:10]
    out["fds"] = max(0, after.fds - before.fds)
    return out
