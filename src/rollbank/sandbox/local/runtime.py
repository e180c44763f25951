"""Command lines of the local runtime: the sandbox's init and the per-command wrapper.

Owns how a sandbox is assembled. Two equivalent paths: the compiled ``rb-helper``
(:mod:`rollbank.sandbox.local.helper`, default: one process per step) and stock tools
(``sh``, ``mount``, ``nsenter``, ``setpriv``; used when no C compiler exists).

* **init** (``rb-helper init`` or ``unshare --mount --propagation private /bin/sh -c ...``):
  join the sandbox's cgroups, set rlimits, mount a size-limited tmpfs (the writable layer)
  and the overlay (``lowerdir`` = the read-only layers, top first) at ``run_dir/mnt`` —
  *inside a private mount namespace only*, so the host never sees these mounts and they
  vanish with the namespace — then exec ``bwrap``, which adds user (root mapped to the
  caller's host id: an unprivileged one with ``userns = "mapped"`` (:class:`IdMapping`: the
  read-only layers are idmapped views, bubblewrap runs as that id), else host root;
  capabilities confined to that namespace, no nested user namespaces), pid, uts, ipc, cgroup and (unless the operator
  allows it) network namespaces, pivots into the overlay and runs the sandbox's anchor as its
  pid 1 (``--as-pid-1``: ``rb-helper anchor``, which reaps orphans; ``sleep infinity`` on the
  stock-tool path). ``--die-with-parent`` ties the sandbox to the orchestrator thread that
  spawned it.
* **exec** (``rb-helper exec`` or ``/bin/sh -c 'echo $$ > ...; exec nsenter ... setpriv'``):
  join the sandbox's cgroups and a fresh per-command group, apply rlimits (open files, file
  size, core=0), enter the anchor's namespaces and root, ``chdir`` *inside* the sandbox, drop
  the capability bounding set to Docker's default set, run the command.

* **pinned exec** (``rb-helper vexec``, helper path only): the init also mounts the pristine
  layers read-only, bound at :data:`PRISTINE_MOUNT` under an empty tmpfs; a pinned command
  gets a private mount namespace and a root assembled from the pristine toolchain and the
  agent's state, with the pristine layers at its pinned paths and at every directory its
  environment names as a toolchain (:func:`env_pins`; see ``csrc/pins.c`` and
  docs/collect.md, "Verifier isolation").

Invariants: every shell path is quoted; overlay option separators in layer paths are
rejected; a working directory is never opened on the host side (``nsenter --wd=DIR`` would).
"""

from __future__ import annotations

import functools
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rollbank.errors import SandboxStartError

NSENTER = "/usr/bin/nsenter"
UNSHARE = "/usr/bin/unshare"
SETPRIV_IN_SANDBOX = "/usr/bin/setpriv"
#: Docker's default capability set, granted inside the sandbox's user namespace.
DEFAULT_CAPS = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "net_bind_service", "net_raw", "sys_chroot", "mknod", "audit_write", "setfcap",
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Where the pristine layers are bound inside every sandbox (under an empty tmpfs: only a
#: pinned command's private mount namespace uncovers them; see ``rb-helper vexec``).
PRISTINE_MOUNT = "/dev/.rollbank-pristine"
#: Where a sandbox's agent channel (``LocalSandboxConfig.agent_channels``) is bound, read-only.
CHANNEL_MOUNT = "/run/rollbank"
_CAP_NUMBERS = {
    "chown": 0, "dac_override": 1, "fowner": 3, "fsetid": 4, "kill": 5, "setgid": 6,
    "setuid": 7, "setpcap": 8, "net_bind_service": 10, "net_raw": 13, "sys_chroot": 18,
    "mknod": 27, "audit_write": 29, "setfcap": 31,
}
DEFAULT_CAP_MASK = sum(1 << _CAP_NUMBERS[c] for c in DEFAULT_CAPS)
#: Where a mapped sandbox's init binds its root for bubblewrap, which runs as the mapped host
#: id and cannot reach ``run_dir`` (a tmpfs over the first of these that holds neither the
#: mount dir nor bubblewrap, in the init's private mount namespace only).
MAPPED_STAGES = ("/tmp", "/run", "/mnt", "/srv")


def mapped_stage(mount_dir: Path, bwrap: str) -> str:
    for stage in MAPPED_STAGES:
        if Path(stage).is_dir() and not any(
                Path(p).is_relative_to(stage) for p in (mount_dir, bwrap)):
            return stage
    raise SandboxStartError(f"no directory of {MAPPED_STAGES} can stage a mapped sandbox's "
                            f"root apart from {mount_dir}")


@dataclass(frozen=True)
class IdMapping:
    """The sandbox's root (uid and gid 0) is host ``host_id``; read-only layers are idmapped
    views in which ids ``0..count-1`` are ``host_id..`` (the map of the user namespace
    ``userns_fd``, inherited by the init), except ``shifted`` layers (frozen writable layers
    of mapped sandboxes: already stored with host ids)."""

    host_id: int
    count: int
    shifted: frozenset[Path] = frozenset()
    userns_fd: int = -1
    full: bool = False  # the sandbox's ids 0..count-1 mapped (rb-helper's full_map_fork), not 0 alone


@functools.cache
def _proc_masks() -> tuple[str, ...]:
    """Docker's /proc masks: read-only /proc/fs; empty acpi/scsi; /dev/null over kernel files
    (which of them this kernel has: looked up once per process, not per start)."""
    args: list[str] = []
    if Path("/proc/fs").is_dir():
        args += ["--ro-bind", "/proc/fs", "/proc/fs"]
    for d in ("acpi", "scsi", "asound"):
        if Path(f"/proc/{d}").is_dir():
            args += ["--tmpfs", f"/proc/{d}", "--remount-ro", f"/proc/{d}"]
    for f in ("kcore", "keys", "timer_list", "sched_debug", "latency_stats"):
        if Path(f"/proc/{f}").exists():
            args += ["--ro-bind", "/dev/null", f"/proc/{f}"]
    return tuple(args)


def overlay_options(layers: Sequence[Path], upper: str, work: str,
                    shown: Sequence[str] | None = None) -> str:
    """``lowerdir=top:...:bottom,upperdir=...,workdir=...`` from layers given lowest first
    (``shown``: the path mounted for each layer, if not the layer itself)."""
    if not layers:
        raise SandboxStartError("a sandbox needs at least one layer (the base filesystem)")
    for p in layers:
        s = str(p)
        if any(c in s for c in ":,\n") or not p.is_absolute():
            raise SandboxStartError(f"layer path unusable in an overlay mount: {s!r}")
        if not p.is_dir():
            raise SandboxStartError(f"layer is not a directory: {s}")
    lower = ":".join(reversed(shown if shown is not None else [str(p) for p in layers]))
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    if len(opts.encode()) >= 4000:  # mount(2) takes one page of options
        raise SandboxStartError(
            f"{len(layers)} layers are too many for one overlay mount ({len(opts)} bytes of "
            "options); squash some layers (or shorten ROLLBANK_CACHE)"
        )
    return opts


def check_pins(pins: Sequence[str]) -> list[str]:
    """Absolute, normalised paths without overlay option separators or newlines."""
    out = []
    for pin in pins:
        p = pin[1:] if pin.startswith("+") else pin  # "+/dir": a private tmpfs
        if (not p.startswith("/") or any(c in p for c in ":,\n\\") or len(p) > 900
                or any(part in ("", ".", "..") for part in p.split("/")[1:])):
            raise SandboxStartError(f"unusable pinned path: {pin!r}")
        out.append(pin)
    return out


#: Environment variables whose directories are the toolchain of the command that sees them.
TOOLCHAIN_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "PERL5LIB", "NODE_PATH",
                 "GOROOT", "VIRTUAL_ENV")


def env_pins(env: Mapping[str, str], layers: Sequence[Path], workdir: str) -> list[str]:
    """The directories a pinned command's environment names as its toolchain (PATH...), and
    the root of a virtual environment whose ``bin`` is one of them (``pyvenv.cfg`` in a
    layer: its libraries live beside it). Not the working directory or what is under it
    (the agent's work), and not paths a pin cannot carry."""
    out: list[str] = []
    work = posixpath.normpath(workdir or "/")
    for name in TOOLCHAIN_ENV:
        for entry in env.get(name, "").split(":"):
            p = posixpath.normpath(entry) if entry.startswith("/") else ""
            if not p or p == "/" or p.startswith("//") or (
                    work != "/" and (p == work or p.startswith(work + "/"))):
                continue
            out.append(p)
            head = posixpath.dirname(p)
            if any((layer / head.lstrip("/") / "pyvenv.cfg").is_file() for layer in layers):
                out.append(head)
    ok = []
    for p in out:
        try:
            ok += check_pins([p])
        except SandboxStartError:
            continue
    return ok


def outermost(pins: Sequence[str]) -> list[str]:
    """``pins`` without those under another plain pin (``/usr/local/bin`` under ``/usr``),
    order kept; ``+`` (private) pins are kept as they are."""
    plain = {p for p in pins if not p.startswith("+")}

    def covered(p: str) -> bool:
        return any(p != q and p.startswith(q.rstrip("/") + "/") for q in plain)

    return list(dict.fromkeys(p for p in pins if p.startswith("+") or not covered(p)))


def expand_pins(patterns: Sequence[str], layers: Sequence[Path]) -> list[str]:
    """Pinned paths with shell-style globs in their components expanded against the layers
    (a path no layer has is kept: the agent must not add it)."""
    out: list[str] = []
    for pat in patterns:
        if not any(c in pat for c in "*?["):
            out.append(pat)
            continue
        found = {"/" + str(m.relative_to(layer)) for layer in layers
                 for m in layer.glob(pat.lstrip("/"))}
        out += sorted(found)
    return list(dict.fromkeys(out))


def rlimit_values(*, open_files: int, file_size_mb: int) -> tuple[str, str]:
    """(open files, file size in bytes) as the helper takes them."""
    return str(int(open_files)), str(int(file_size_mb) << 20)


def rlimit_shell(*, open_files: int, file_size_mb: int) -> str:
    """dash ``ulimit`` flags (``-f`` counts 512-byte blocks)."""
    return f"ulimit -c 0 && ulimit -n {int(open_files)} && ulimit -f {int(file_size_mb) * 2048}"


def idmapped_views(layers: Sequence[Path], mount_dir: Path, mapping: IdMapping | None,
                   stage: str = "/tmp") -> tuple[list[str], str]:
    """(the path the overlay uses for each layer, the helper's ``MAP`` argument)."""
    if mapping is None:
        return [str(p) for p in layers], "-"
    shown, pairs = [], []
    for i, layer in enumerate(layers):
        if layer in mapping.shifted:
            shown.append(str(layer))
        else:
            shown.append(f"{mount_dir}/l{i}")
            pairs += [str(layer), shown[-1]]
    return shown, "\n".join(
        [f"{int(mapping.host_id)} {int(mapping.userns_fd)} {stage}"
         + (f" {int(mapping.count)}" if mapping.full else ""), *pairs])


def init_argv(
    *,
    procs_files: Sequence[Path],
    mount_dir: Path,
    layers: Sequence[Path],
    storage_mb: int,
    rlimits: str,
    bwrap: str,
    hostname: str,
    network: bool,
    helper: Path | None = None,
    rlimit_vals: tuple[str, str] = ("1024", str(1 << 30)),
    mapping: IdMapping | None = None,
    channel: Path | None = None,
    files: Sequence[tuple[int, str]] = (),
    ready_fd: int | None = None,
) -> list[str]:
    """The sandbox's init. ``mapping`` (helper path only): the sandbox's root is an
    unprivileged host id (see :class:`IdMapping` and ``rb-helper init``'s ``MAP``).
    ``files``: (inherited descriptor, path) bubblewrap copies into the sandbox at start
    (``/etc/hosts``...: :mod:`~rollbank.sandbox.local.etc_files`). ``ready_fd`` (helper path
    only): an inherited pipe's write end, on which the anchor writes one byte once it runs
    (``rb-helper anchor READY_FD``), so the start is awaited, not polled."""
    q = shlex.quote
    m = str(mount_dir)
    if mapping is not None and helper is None:
        raise SandboxStartError("user-namespace id mapping needs rb-helper (a C compiler)")
    stage = m if mapping is None else mapped_stage(mount_dir, bwrap)
    shown, idmap = idmapped_views(layers, mount_dir, mapping, stage)
    # the pristine layers (read-only) for pinned verifier commands: helper path only
    pristine = "lowerdir=" + ":".join(reversed(shown)) if helper else "-"
    joins = " && ".join(f"echo $$ > {q(str(f))}" for f in procs_files) or "true"
    opts = overlay_options(layers, f"{m}/upper", f"{m}/work", shown)
    bw = [
        bwrap, "--bind", f"{stage}/root", "/", "--proc", "/proc",
        # The sandbox's root may be host uid 0 (userns "off"), and sysctl writes are checked by uid
        # only: /proc/sys must be read-only (Docker does the same). Net sysctls resolve to the
        # reader's own network namespace, so the host's /proc/sys shows nothing extra.
        "--ro-bind", "/proc/sys", "/proc/sys", *_proc_masks(), "--dev", "/dev",
        "--unshare-user", *(["--userns-block-fd", "@BLOCKFD@", "--info-fd", "@INFOFD@",
                             "--assert-userns-disabled"] if mapping is not None and mapping.full
                            else ["--disable-userns"]), "--uid", "0", "--gid", "0",
        "--unshare-pid", "--unshare-ipc",
        "--unshare-uts", "--unshare-cgroup-try", "--hostname", hostname,
        "--die-with-parent", "--new-session", "--chdir", "/",
    ]
    if helper is not None:
        bw += ["--ro-bind", f"{stage}/pristine", PRISTINE_MOUNT,
               "--tmpfs", PRISTINE_MOUNT, "--remount-ro", PRISTINE_MOUNT]
    if channel is not None:  # the agent channel: a host directory, read-only inside
        bw += ["--ro-bind", str(channel), CHANNEL_MOUNT]
    for fd, dest in files:
        bw += ["--perms", "0644", "--file", str(int(fd)), dest]
    if not network:
        bw.append("--unshare-net")
    # The anchor is the sandbox's pid 1 (--as-pid-1): signals from inside cannot kill it, so
    # a command like `kill -9 -1` ends the model's processes, not the sandbox. With the helper
    # it also reaps orphans; the shell fallback's `sleep` leaves them as zombies.
    bw += ["--as-pid-1", "--", "@ANCHOR@" if helper is not None else "/bin/sleep"]
    bw += ["infinity"] if helper is None else ["anchor"] + (
        [] if ready_fd is None else [str(int(ready_fd))])
    if helper is not None:
        return [
            str(helper), "init", m, str(int(storage_mb)), opts, pristine, *rlimit_vals, idmap,
            str(len(procs_files)), *map(str, procs_files), "--", *bw,
        ]
    script = (
        f"set -e; {joins}; {rlimits}; "
        f"mount -t tmpfs -o size={int(storage_mb)}m,mode=0755 rollbank-upper {q(m)}; "
        f"mkdir {q(m + '/upper')} {q(m + '/work')} {q(m + '/root')}; "
        f"mount -t overlay rollbank -o {q(opts)} {q(m + '/root')}; "
        f"exec {shlex.join(bw)}"
    )
    return [UNSHARE, "--mount", "--propagation", "private", "/bin/sh", "-c", script]


def exec_argv(
    *,
    anchor_pid: int,
    procs_files: Sequence[Path],
    rlimits: str,
    command: str | Sequence[str],
    cwd: str,
    drop_caps: bool,
    helper: Path | None = None,
    rlimit_vals: tuple[str, str] = ("1024", str(1 << 30)),
    pins: Sequence[str] | None = None,
) -> list[str]:
    """The per-command wrapper. ``pins`` (helper path only): run in a private mount namespace
    where these paths show the pristine layers' version (``rb-helper vexec``)."""
    q = shlex.quote
    joins = " && ".join(f"echo $$ > {q(str(f))}" for f in procs_files) or "true"
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if helper is not None:
        mask = f"{DEFAULT_CAP_MASK:x}" if drop_caps else "0"
        mode = ["exec"] if pins is None else ["vexec"]
        pinned = [] if pins is None else ["\n".join(check_pins(pins)) or "-"]
        return [
            str(helper), *mode, str(anchor_pid), cwd or "/", *rlimit_vals, mask, *pinned,
            str(len(procs_files)), *map(str, procs_files), "--", *argv,
        ]
    if pins is not None:
        raise SandboxStartError("pinned (verifier) commands need rb-helper (a C compiler)")
    inner: list[str] = []
    if drop_caps:
        caps = ",".join(["-all", *(f"+{c}" for c in DEFAULT_CAPS)])
        inner = [SETPRIV_IN_SANDBOX, f"--bounding-set={caps}", "--inh-caps=-all", "--"]
    if cwd not in ("", "/"):
        # nsenter --wd=DIR would open DIR on the *host* before entering the sandbox: never.
        argv = ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', cwd, *argv]
    ns = [
        NSENTER, "-t", str(anchor_pid), "-U", "-m", "-u", "-i", "-n", "-p", "-C",
        "--preserve-credentials", "-r", "-w", "--", *inner, *argv,
    ]
    script = f"{joins} && {rlimits} && exec {shlex.join(ns)}"
    return ["/bin/sh", "-c", script]
