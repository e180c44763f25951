"""Operator configuration of the local (bubblewrap + overlayfs + cgroups) sandbox backend.

Owns :class:`LocalSandboxConfig`. Invariants: every field is documented and bounded; the
operator, never a task, decides whether a sandbox may reach the network
(``allow_network``) and whether commands may run without isolation (never: there is no such
switch here; the backend fails with :class:`~rollbank.errors.IsolationUnavailableError`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from rollbank.config import Section, cache_dir


def default_run_dir() -> Path:
    return cache_dir() / "sandboxes"


class LocalSandboxConfig(Section):
    """How the local backend isolates, limits and stores sandboxes."""

    run_dir: Path = Field(
        default_factory=default_run_dir,
        description="Directory for snapshots (frozen writable layers) and the mount point "
        "used inside each sandbox's private mount namespace. Subdirectories of dead "
        "orchestrators are reaped on start.",
    )
    allow_network: bool = Field(
        default=False,
        description="Operator switch: honour a spec's network=True (a task's "
        "allow_internet). When False every sandbox gets loopback only.",
    )
    max_concurrent_starts: int = Field(
        default=16, ge=1, le=1024,
        description="Bound on sandbox starts in flight at once (fork/start concurrency).",
    )
    max_storage_mb: int = Field(
        default=4096, ge=16,
        description="Cap on a spec's storage_mb. The writable layer is a tmpfs of "
        "min(storage_mb, max_storage_mb) MiB inside the sandbox's mount namespace; its pages "
        "are charged to the sandbox's memory cgroup.",
    )
    max_memory_mb: int = Field(
        default=16384, ge=64, description="Cap on a spec's memory_mb (cgroup memory limit)."
    )
    max_cpus: float = Field(default=2.0, gt=0, description="Cap on a spec's cpus (CPU quota).")
    max_processes: int = Field(
        default=4096, ge=8, description="Cap on a spec's max_processes (cgroup pids.max)."
    )
    drop_capabilities: bool = Field(
        default=True,
        description="Run commands with Docker's default capability set inside the sandbox's "
        "user namespace (via setpriv) instead of the full set of the namespace's root.",
    )
    bwrap: str = Field(default="/usr/bin/bwrap", description="Path of the bubblewrap binary.")
    userns: Literal["auto", "mapped", "off"] = Field(
        default="auto",
        description="User-namespace id mapping. 'mapped': the sandbox's root (uid/gid 0) is "
        "the unprivileged host id userns_host_id (read-only layers are idmapped views, the "
        "writable layer and snapshots hold host ids userns_host_id+); the backend refuses to "
        "start (IsolationUnavailableError, naming the failing step) if this host cannot. "
        "'off': the sandbox's root is host uid 0 (capabilities confined to its namespaces). "
        "'auto': 'mapped' when rb-helper and a probe of the kernel and run_dir's filesystem "
        "succeed, else 'off' (LocalBackend.userns_reason says why).",
    )
    userns_host_id: int = Field(
        default=100000, ge=1, le=(1 << 32) - 2 * 65536,
        description="First host uid/gid of the mapping: the sandbox's root; ids 0-65535 of "
        "the read-only layers show as this id and the next 65535. Use ids no host user or "
        "service owns (the subordinate range of /etc/subuid conventions starts here).",
    )
    userns_full_range: bool = Field(
        default=True,
        description="Mapped sandboxes only: map all of the sandbox's ids 0-65535 (to host "
        "userns_host_id..), not uid 0 alone, so service users of the image (redis, postgres) "
        "own their files and su/setpriv to them work (rb-helper writes the maps into "
        "bubblewrap's user namespace before it goes on; nested user namespaces stay refused).",
    )
    use_helper: bool = Field(
        default=True,
        description="Compile and use rb-helper (one process instead of sh+mount+nsenter+"
        "setpriv per start/command); falls back to the shell path without a C compiler.",
    )
    reap_on_start: bool = Field(
        default=True,
        description="On backend start, kill cgroups and delete snapshots left behind by "
        "orchestrators that died (SIGKILL) without cleaning up.",
    )
    agent_channels: bool = Field(
        default=False,
        description="Give each sandbox a private channel directory, bound read-only at "
        "/run/rollbank inside it, where an in-sandbox agent's one forwarded endpoint appears "
        "(a unix socket to its gateway session: rollbank.agents.forward). Off: no channel.",
    )
    agent_channel_dir: Path = Field(
        default=Path("/dev/shm/rollbank-channels"),
        description="Host directory holding the channel directories (agent_channels); it "
        "must be traversable by the sandbox's mapped uid (not under a 0700 home) and not "
        "under a mapped sandbox's stage (/tmp, /run, /mnt, /srv: hidden from bubblewrap)",
    )
    max_host_stall_s: float = Field(
        default=600.0, gt=0,
        description="Host stall (seconds a command's cgroup was frozen or all its tasks waited "
        "for a CPU) credited to one command; the model is never billed for it. A command stalled "
        "longer is stopped as host_stalled (infra), not timed out.",
    )
