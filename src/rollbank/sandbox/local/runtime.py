"""Command lines of the local runtime: the sandbox's init and the per-command wrapper.

Owns how a sandbox is assembled from host tools (no helper binary to build):

* **init** = ``unshare --mount --propagation private /bin/sh -c INIT``. The shell joins the
  sandbox's cgroups (``echo $$``), sets rlimits, mounts a size-limited tmpfs (the writable
  layer) and the overlay (``lowerdir`` = the read-only layers, top first) at ``run_dir/mnt``
  — *inside its private mount namespace only*, so the host never sees these mounts and they
  vanish with the namespace — then execs ``bwrap``, which adds user (root mapped to root,
  capabilities confined to that namespace), pid, uts, ipc, cgroup and (unless the operator
  allows it) network namespaces, pivots into the overlay and runs ``sleep infinity`` as the
  sandbox's anchor (bwrap's own pid 1 reaps zombies). ``--die-with-parent`` ties the whole
  sandbox to the orchestrator thread that spawned it.
* **exec** = ``/bin/sh -c WRAP``: joins the sandbox's cgroups and a fresh per-command group,
  applies rlimits (open files, file size, core=0), then ``nsenter`` into the anchor's
  namespaces and root, optionally through ``setpriv`` to Docker's default capability set.

Invariants: every path is shell-quoted; overlay option separators in layer paths are rejected.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
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


def overlay_options(layers: Sequence[Path], upper: str, work: str) -> str:
    """``lowerdir=top:...:bottom,upperdir=...,workdir=...`` from layers given lowest first."""
    if not layers:
        raise SandboxStartError("a sandbox needs at least one layer (the base filesystem)")
    for p in layers:
        s = str(p)
        if any(c in s for c in ":,\n") or not p.is_absolute():
            raise SandboxStartError(f"layer path unusable in an overlay mount: {s!r}")
        if not p.is_dir():
            raise SandboxStartError(f"layer is not a directory: {s}")
    lower = ":".join(str(p) for p in reversed(layers))
    return f"lowerdir={lower},upperdir={upper},workdir={work}"


def rlimit_shell(*, open_files: int, file_size_mb: int) -> str:
    """dash ``ulimit`` flags (``-f`` counts 512-byte blocks)."""
    return f"ulimit -c 0 && ulimit -n {int(open_files)} && ulimit -f {int(file_size_mb) * 2048}"


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
) -> list[str]:
    q = shlex.quote
    m = str(mount_dir)
    joins = " && ".join(f"echo $$ > {q(str(f))}" for f in procs_files) or "true"
    opts = overlay_options(layers, f"{m}/upper", f"{m}/work")
    bw = [
        bwrap, "--bind", f"{m}/root", "/", "--proc", "/proc", "--dev", "/dev",
        "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid", "--unshare-ipc",
        "--unshare-uts", "--unshare-cgroup-try", "--hostname", hostname,
        "--die-with-parent", "--new-session", "--chdir", "/",
    ]
    if not network:
        bw.append("--unshare-net")
    bw += ["--", "/bin/sleep", "infinity"]
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
) -> list[str]:
    q = shlex.quote
    joins = " && ".join(f"echo $$ > {q(str(f))}" for f in procs_files) or "true"
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
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
