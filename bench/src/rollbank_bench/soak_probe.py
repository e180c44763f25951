"""What a soak reads of this process and the host, once per sample (synchronous: call it off
the event loop): open descriptors (and what each is), threads, resident memory, descendant
processes, mounts, rollbank cgroups and live sandboxes.

Shared by ``bench soak`` (:mod:`rollbank_bench.soak`) and its faulted variant
(:mod:`rollbank_bench.soak_faults`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def _descendants(root: int) -> int:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    count, todo = 0, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            count += 1
            todo.append(c)
    return count


def count_dirs(top: Path, scandir: Callable[[Path], Any] = os.scandir) -> int:
    """Directories under ``top`` (not itself). One removed while the walk reaches it (a
    sandbox's cgroup going away under continuous collection) is skipped, not an error."""
    n, todo = 0, [top]
    while todo:
        d = todo.pop()
        try:
            with scandir(d) as it:
                subs = [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        n += len(subs)
        todo += subs
    return n


def _own_cgroups() -> int:
    """Directories under this process's rollbank owner cgroups (every hierarchy)."""
    from rollbank_bench.faults.leaks import owner_cgroup_dirs

    return sum(count_dirs(top) for top in owner_cgroup_dirs())


def counted_fds() -> Iterator[tuple[str, str]]:
    """``(fd, target)`` of the open descriptors a soak counts: not files of installed packages
    that a library keeps open once for good (matplotlib's fonts, loaded by the first report)."""
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if "/site-packages/" not in target:
            yield fd.name, target


def open_fds() -> int:
    """How many descriptors :func:`counted_fds` counts."""
    return sum(1 for _ in counted_fds())


def _socket_table() -> dict[str, str]:
    """Socket inode -> ``"tcp LOCAL->REMOTE STATE"`` from this process's /proc/net tables
    (TCP over IPv4 and IPv6; other families are named by their table)."""
    states = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN",
              "07": "CLOSE", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "09": "LAST_ACK"}
    table: dict[str, str] = {}
    for name in ("tcp", "tcp6", "udp", "udp6", "unix"):
        try:
            lines = Path(f"/proc/self/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if name == "unix":
                if len(f) >= 7:
                    table[f[6]] = "unix" + (f" {f[7]}" if len(f) > 7 else "")
                continue
            if len(f) < 10:
                continue
            ports = [int(a.rsplit(":", 1)[1], 16) for a in (f[1], f[2])]
            table[f[9]] = f"{name} :{ports[0]}->:{ports[1]} {states.get(f[3], f[3])}"
    return table


#: one reading at a time: a reading opens files (``/proc`` walks, ``status``, ``mountinfo``) and
#: two readings in two threads (the periodic probe and a round's drained reading) counted each
#: other's open files as this process's (+1..4 fds on a drained reading, a false leak)
_READING = threading.Lock()


def describe_fds() -> dict[str, Any]:
    """What the counted descriptors (:func:`open_fds`) are: per kind (``tcp``, ``unix``, ``pipe``,
    ``pidfd``, ``eventpoll``, ``file``, ...) and, for sockets, their ports and state, so a
    drained reading that moves says which descriptors moved."""
    with _READING:
        return _describe_fds()


def _describe_fds() -> dict[str, Any]:
    sockets: dict[str, str] | None = None
    kinds: dict[str, int] = {}
    items: list[str] = []
    for fd, target in sorted(counted_fds(), key=lambda ft: int(ft[0])):
        if target.startswith("socket:["):
            if sockets is None:
                sockets = _socket_table()
            what = sockets.get(target[8:-1], "socket (closed or other family)")
            kind = what.split()[0]
        elif target.startswith(("pipe:", "anon_inode:")):
            what = target
            kind = target.split(":", 1)[1].strip("[]") if target.startswith("anon_inode:") else "pipe"
        else:
            what, kind = target, "file"
        kinds[kind] = kinds.get(kind, 0) + 1
        items.append(f"{fd} {what}")
    return {"by_kind": kinds, "fds": items}


def mount_points() -> list[str]:
    """The host mount table as ``mount point fstype source`` lines (``mounts`` counts them; the
    table is the host's, shared with every other job on it: a round-end diff against the
    baseline says whose mounts moved)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        out.append(" ".join([fields[4], *tail[:2]]) if len(fields) > 4 else line)
    return out


def sample(live_sandboxes: Callable[[], int]) -> dict[str, float]:
    """One reading of every tracked resource (synchronous: call it off the event loop); never
    two at once (:data:`_READING`)."""
    with _READING:
        return _sample(live_sandboxes)


def _sample(live_sandboxes: Callable[[], int]) -> dict[str, float]:
    status = Path("/proc/self/status").read_text()
    rss_kib = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:")), 0)
    threads = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Threads:")), 0)
    return {"t": time.time(), "fds": open_fds(), "threads": threads,
            "rss_mib": round(rss_kib / 1024, 1), "processes": _descendants(os.getpid()),
            "mounts": len(Path("/proc/self/mountinfo").read_text().splitlines()),
            "cgroups": _own_cgroups(), "sandboxes": live_sandboxes()}
