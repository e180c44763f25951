"""`rollbank bench soak`: a long collection on real sandboxes checking that nothing grows.

Runs one collection of ``--batches`` batches with fake inference (``inference.kind = fake``:
the model's time is simulated, the sandboxes, tool commands and verifiers are real) and,
after every batch is handed over, samples this process and the host: open file descriptors,
threads, resident memory, descendant processes, mounts (host mount table), rollbank
cgroups (this process's groups under every hierarchy) and live sandboxes. The first
``--warmup`` batches are excluded (pools, caches and the warm snapshots fill up then); over
the rest a resource is *flat* when its floor (minimum over the second half of the samples)
is at most its allowance above its floor over the first half.
After the collection closes, the same counts must be back at the baseline taken before it
started (nothing leaked by closing; descriptors of installed packages' files, which a library
keeps open once loaded, are not counted).

JSON: the samples per batch, the growth per resource, ``flat`` (all within allowance) and
``leaked_after_close``. Numbers, not timed assertions: the smoke test only checks the shape
and the after-close leak counts.

``--faults`` runs the faulted soak instead (:mod:`rollbank.bench.soak_faults`): continuous
collection for ``--minutes`` on the fault campaign's rig, sampled every ``--interval``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Allowed growth from the first sample after warm-up to the last (RSS in MiB).
ALLOWANCE = {"fds": 4, "threads": 4, "rss_mib": 32, "processes": 2, "mounts": 0,
             "cgroups": 2, "sandboxes": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--batches", type=int, default=20, help="batches collected (samples taken)")
    a("--warmup", type=int, default=2, help="first batches not judged (pools fill up)")
    a("--groups", type=int, default=None, help="G: complete groups per batch (default 2; "
      "--faults: the campaign's 4)")
    a("--group-size", type=int, default=None, help="n: siblings per group (default 2; "
      "--faults: the campaign's 4)")
    f = parser.add_argument_group("faulted soak (rollbank.bench.soak_faults)")
    f.add_argument("--faults", action="store_true", help="continuous collection on the fault "
                   "campaign's rig with faults injected, sampled each --interval, for --minutes")
    f.add_argument("--minutes", type=float, default=30.0, help="--faults: minutes of collection")
    f.add_argument("--interval", type=float, default=60.0, help="--faults: seconds per curve point")
    f.add_argument("--probe", type=float, default=5.0, help="--faults: seconds between probes")
    f.add_argument("--warmup-minutes", type=int, default=2,
                   help="--faults: first intervals not judged")
    f.add_argument("--seed", type=int, default=0, help="--faults: fault schedule seed")
    f.add_argument("--rate", type=float, default=0.6, help="--faults: share of attempts faulted")
    f.add_argument("--plot", default=None, help="--faults: write the curve as a PNG here")
    f.add_argument("--keep-rounds", action="store_true",
                   help="--faults: keep each round's run folder (default: deleted once judged)")
    a("--tasks", default="hello-greeting,count-lines", help="terminal-lite tasks, comma-separated")
    a("--out", default=None, help="run folder (default: a temporary one, deleted)")


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
    from rollbank.bench.faults.leaks import owner_cgroup_dirs

    return sum(count_dirs(top) for top in owner_cgroup_dirs())


def _counted_fds() -> Iterator[tuple[str, str]]:
    """``(fd, target)`` of the open descriptors a soak counts: not files of installed packages
    that a library keeps open once for good (matplotlib's fonts, loaded by the first report)."""
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if "/site-packages/" not in target:
            yield fd.name, target


def _fds() -> int:
    """How many descriptors :func:`_counted_fds` counts."""
    return sum(1 for _ in _counted_fds())


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


def describe_fds() -> dict[str, Any]:
    """What the counted descriptors (:func:`_fds`) are: per kind (``tcp``, ``unix``, ``pipe``,
    ``pidfd``, ``eventpoll``, ``file``, ...) and, for sockets, their ports and state, so a
    drained reading that moves says which descriptors moved."""
    sockets: dict[str, str] | None = None
    kinds: dict[str, int] = {}
    items: list[str] = []
    for fd, target in sorted(_counted_fds(), key=lambda ft: int(ft[0])):
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


def sample(live_sandboxes: Callable[[], int]) -> dict[str, float]:
    """One reading of every tracked resource (synchronous: call it off the event loop)."""
    status = Path("/proc/self/status").read_text()
    rss_kib = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:")), 0)
    threads = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Threads:")), 0)
    return {"t": time.time(), "fds": _fds(), "threads": threads,
            "rss_mib": round(rss_kib / 1024, 1), "processes": _descendants(os.getpid()),
            "mounts": len(Path("/proc/self/mountinfo").read_text().splitlines()),
            "cgroups": _own_cgroups(), "sandboxes": live_sandboxes()}


def judge(samples: list[dict[str, float]], warmup: int) -> dict[str, Any]:
    """Growth of each resource's *floor* over the judged samples: the minimum of their second
    half minus the minimum of their first half (a sample taken at a batch hand-off includes
    whatever is in flight then; a leak raises the floor), and whether each stays within its
    allowance."""
    judged = samples[warmup:] if len(samples) > warmup + 1 else samples
    half = max(1, len(judged) // 2)
    first, second = judged[:half], judged[half:] or judged[:half]
    growth = ({k: round(min(x[k] for x in second) - min(x[k] for x in first), 1)
               for k in ALLOWANCE} if judged else {})
    return {"judged_samples": len(judged), "growth": growth,
            "flat": bool(judged) and all(growth[k] <= ALLOWANCE[k] for k in ALLOWANCE)}


async def soak(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from rollbank.collect_config import load_collect_config
    from rollbank.collector import collect
    from rollbank.episodes.sandboxes import open_sandboxes
    from rollbank.inference_plane import open_inference
    from rollbank.task_selection import select_tasks

    overrides: dict[str, object] = {
        "include": [t.strip() for t in args.tasks.split(",") if t.strip()], "output": str(out),
        "metrics.live": "off", "inference.kind": "fake", "runner.max_turns": 2,
        "scheduler.groups_per_batch": args.groups, "scheduler.pool_groups": args.groups,
        "scheduler.bank.group_size": args.group_size, "scheduler.num_batches": args.batches,
        "scheduler.bank.dynamic_sampling.enabled": False,
        "scheduler.sandbox_slots": max(2, args.groups * args.group_size),
    }
    cfg = await asyncio.to_thread(load_collect_config, None, overrides)
    tasks = await asyncio.to_thread(select_tasks, cfg)
    baseline = await asyncio.to_thread(sample, lambda: 0)
    samples: list[dict[str, float]] = []
    t0 = time.monotonic()
    async with open_inference(cfg.inference, max_model_len=cfg.runner.max_model_len) as plane, \
            open_sandboxes(cfg.sandbox, tasks) as sandboxes:
        source: Any = sandboxes.source  # warm: its pool's backend; cold: its own
        backend = source.pool.backend if hasattr(source, "pool") else source.backend

        def n_live() -> int:
            return len(backend.sandboxes)

        async def on_batch(batch: Any, path: Path) -> None:
            samples.append({"batch": len(samples), **await asyncio.to_thread(sample, n_live)})

        await collect(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes, out_dir=out,
                      on_batch=on_batch)
    after = await asyncio.to_thread(sample, lambda: 0)
    leaked = {k: round(after[k] - baseline[k], 1) for k in ("fds", "processes", "mounts", "cgroups")}
    return {"bench": "soak", "batches": len(samples), "wall_s": round(time.monotonic() - t0, 1),
            "groups": args.groups, "group_size": args.group_size, "tasks": [t.task_id for t in tasks],
            "allowance": ALLOWANCE, "samples": samples, **judge(samples, args.warmup),
            "baseline": baseline, "after_close": after, "leaked_after_close": leaked}


def run(args: argparse.Namespace) -> int:
    if args.faults:
        from rollbank.bench import soak_faults

        return soak_faults.run(args)
    args.groups = 2 if args.groups is None else args.groups
    args.group_size = 2 if args.group_size is None else args.group_size
    if args.out:
        report = asyncio.run(soak(args, Path(args.out)))
    else:
        with tempfile.TemporaryDirectory(prefix="rollbank-soak-") as tmp:
            report = asyncio.run(soak(args, Path(tmp)))
    print(json.dumps(report, indent=2))
    return 0 if report["flat"] and not any(report["leaked_after_close"].values()) else 1
