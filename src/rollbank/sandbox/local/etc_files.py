"""The files a container runtime writes into every container: ``/etc/hosts``, ``/etc/hostname``,
``/etc/resolv.conf``.

Owns their content (as Docker writes them: ``localhost`` on the IPv4 and IPv6 loopback, the
container's hostname on its own address, the host's resolver without loopback nameservers)
and how they reach a sandbox: one memfd each, copied by bubblewrap (``--file FD DEST``) into
the sandbox's writable layer at start — no extra process, no command in the sandbox, and the
files stay the agent's to edit (a task may add hosts). Only for images that have ``/etc``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

HOSTS = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
         "ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
         "127.0.1.1\t{hostname}\n")
#: Docker's fallback when the host's resolver is only reachable on its own loopback.
FALLBACK_DNS = "nameserver 8.8.8.8\nnameserver 8.8.4.4\n"


def resolv_conf(host_text: str) -> str:
    """The host's resolv.conf without nameservers on loopback (unreachable from a sandbox)."""
    lines = [ln for ln in host_text.splitlines()
             if not (ln.split()[:1] == ["nameserver"] and len(ln.split()) > 1
                     and (ln.split()[1].startswith("127.") or ln.split()[1] == "::1"))]
    if not any(ln.split()[:1] == ["nameserver"] for ln in lines):
        lines += FALLBACK_DNS.splitlines()
    return "\n".join(lines) + "\n"


def etc_files(hostname: str, host_resolv: str) -> dict[str, bytes]:
    return {"/etc/hosts": HOSTS.format(hostname=hostname).encode(),
            "/etc/hostname": f"{hostname}\n".encode(),
            "/etc/resolv.conf": resolv_conf(host_resolv).encode()}


def wants_etc(layers: Sequence[Path]) -> bool:
    return any((layer / "etc").is_dir() for layer in layers)


def host_resolv() -> str:
    try:
        return Path("/etc/resolv.conf").read_text(errors="replace")
    except OSError:
        return ""


def memfds(files: dict[str, bytes]) -> list[tuple[int, str]]:
    """(descriptor, destination) per file, each a memfd holding the content at offset 0 (the
    caller passes them to the init and closes them after it started)."""
    out: list[tuple[int, str]] = []
    try:
        for dest, data in files.items():
            fd = os.memfd_create("rollbank-etc")
            out.append((fd, dest))
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        for fd, _ in out:
            os.close(fd)
        raise
    return out
