"""The id mapping of mapped sandboxes, host side: the probe and the mapping's user namespace.

Owns :func:`probe_userns` (may this host map? ``rb-helper probe``) and :func:`mapping_userns`:
the user namespace whose id map (``0..count-1`` -> host ``host_id..``) every mapped
sandbox's idmapped layers use. It is made once per backend (``unshare --user`` of a
``sleep`` whose maps are written from here, then the ``sleep`` is killed: an open descriptor
keeps the namespace alive) and handed to each sandbox's init as an inherited descriptor, so a
start forks no extra process for it. Design: docs/collect.md, "User-namespace id mapping".
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

#: Ids mapped on idmapped layers (0-65535: every id a Debian/Ubuntu base uses).
USERNS_COUNT = 65536
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
UNSHARE = "/usr/bin/unshare"


def probe_userns(helper: Path | None, mount_dir: Path, host_id: int, bwrap: str,
                 timeout_s: float = 30.0) -> str | None:
    """None if sandboxes can be mapped here, else why not (``rb-helper probe``: an idmapped
    layer under an overlay and bubblewrap run as ``host_id``, in a throw-away namespace)."""
    if helper is None:
        return "user-namespace id mapping needs rb-helper (no C compiler, or use_helper off)"
    try:
        proc = subprocess.run(
            [str(helper), "probe", str(mount_dir), str(host_id), str(USERNS_COUNT), bwrap],
            capture_output=True, text=True, timeout=timeout_s, check=False, env=_ENV,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the id-mapping probe did not run: {exc}"
    if proc.returncode != 0:
        return f"the id-mapping probe failed: {proc.stderr.strip()[-500:] or proc.returncode}"
    return None


def mapping_userns(host_id: int, count: int = USERNS_COUNT, timeout_s: float = 10.0) -> int:
    """A descriptor of a new user namespace mapping uid and gid ``0..count-1`` to host
    ``host_id..`` (close it when done). Raises OSError if it cannot be made."""
    own = Path("/proc/self/ns/user").stat().st_ino
    holder = subprocess.Popen([UNSHARE, "--user", "/bin/sleep", "infinity"], env=_ENV,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        ns = Path(f"/proc/{holder.pid}/ns/user")
        while ns.stat().st_ino == own:  # until unshare(2) has run in the holder
            if holder.poll() is not None or time.monotonic() > deadline:
                err = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
                raise OSError(f"unshare --user failed: {err.strip() or holder.returncode}")
            time.sleep(0.001)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as f:
                f.write(f"0 {int(host_id)} {int(count)}\n")
        return os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        holder.wait()
        if holder.stderr is not None:
            holder.stderr.close()
