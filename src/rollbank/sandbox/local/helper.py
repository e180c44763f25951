"""``rb-helper``: a tiny C program that replaces ``sh`` + ``mount`` + ``nsenter`` + ``setpriv``.

Owns the helper's source and its build. Starting a sandbox and running a command each cost a
handful of process executions when done with shell tools (measured here: ~4 ms of CPU per
command); the helper does the same syscalls in one process:

* ``rb-helper init MOUNT_DIR STORAGE_MB OVERLAY_OPTS PRISTINE NOFILE FSIZE MAP N CG... -- BWRAP ARGV``:
  ``unshare(CLONE_NEWNS)`` + private propagation, join the cgroups, set rlimits (core 0,
  open files, file size), mount the tmpfs writable layer and the overlay, mount the pristine
  layers read-only at ``MOUNT_DIR/pristine`` (``PRISTINE``: ``lowerdir=`` options, a bind for
  one layer, ``-`` for none; bwrap hides it under an empty tmpfs), exec bubblewrap. ``MAP``
  (``-``: off) maps the sandbox's root to an unprivileged host id
  (``csrc/userns.c``): the upper layer owned by that id, idmapped
  read-only views of the listed layers (with the map of an inherited user namespace), the
  root bound at a stage bubblewrap can reach, and bubblewrap exec'd as that id.
* ``rb-helper anchor [READY_FD]``: the sandbox's pid 1 (``bwrap --as-pid-1``), run from a
  descriptor the init inherits to bwrap: it cannot be killed from inside the sandbox (a
  model's ``kill -9 -1`` does not take the sandbox down) and it reaps orphaned processes. It
  first writes one byte on ``READY_FD`` (a pipe the backend awaits: the start is an event,
  not a poll of ``/proc``), then closes every descriptor but 0-2.
* ``rb-helper exec ANCHOR CWD NOFILE FSIZE CAPMASK N CG... -- ARGV``: join the cgroups, set
  rlimits, ``setns`` (one pidfd call: user, mount, uts, ipc, net, pid, cgroup) into the anchor's
  namespaces, ``chroot`` to its root (fd opened before entering), ``chdir`` *inside* the
  sandbox, drop the capability bounding set to ``CAPMASK`` (0 = keep) and clear inheritable
  and ambient capabilities, fork (the pid namespace applies to children), exec ARGV, and
  mirror the child's exit status or signal. In a mapped sandbox the command becomes the root
  of the sandbox's user namespace (the mapped host id), not host root.
* ``rb-helper vexec ANCHOR CWD NOFILE FSIZE CAPMASK PINS N CG... -- ARGV``: ``exec``, but the
  child first gets a private mount namespace (inside the sandbox's user namespace) with a
  root assembled fresh (``csrc/pins.c``): the pristine layers' merged-usr links and
  one-component ``PINS`` (``/usr``), the agent's other top-level directories bound in as they
  are, no other file the agent added at ``/``; then each deeper path of ``PINS``
  (newline-separated) shows the pristine layers' version (a directory: an overlay of the
  pristine one with a throw-away tmpfs upper; a file: a read-only bind; a path the pristine
  layers lack: an empty tmpfs or ``/dev/null`` over whatever the agent put there). A pin
  ``+/path`` is a fresh private directory reached through fresh parents (the verifier's
  ``/tests`` and ``/logs/verifier``: what the agent's live processes cannot reach, and no
  symlink of the agent's leads elsewhere). Nothing of this is visible to the sandbox's other
  processes. A pin that cannot apply because the agent replaced a pristine directory by a
  non-directory exits 126 (the command cannot run).

The C source is package data in ``csrc/``: ``main.c`` (init, exec, anchor), ``pins.c`` (the
pinned view of ``vexec``; docs/collect.md, "Verifier isolation"), ``userns.c`` (the id mapping
of a mapped sandbox and ``rb-helper probe``; its header comment
documents it) and ``rb-helper.h``.

Failure protocol: when the runtime (not the command) fails, the helper writes
``rb-helper: WHAT: ERRNO TEXT`` and exits 125; :mod:`~rollbank.sandbox.local.helper_failure`
classifies that.

It is compiled once with the host's C compiler (``-Wall -Wextra -Werror``: a warning is a
build failure, raised as :class:`~rollbank.errors.SandboxError` with the compiler's message)
into ``<cache>/bin/rb-helper-<hash of the sources and flags>`` (atomically renamed into place).
Without a compiler the backend uses the shell path of :mod:`rollbank.sandbox.local.runtime`,
which does the same with stock tools (and cannot pin the verifier).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

from rollbank.config import cache_dir
from rollbank.errors import SandboxError

#: The helper's C sources (package data), compiled together.
SOURCES = ("rb-helper.h", "main.c", "pins.c", "userns.c")
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")


def sources() -> dict[str, bytes]:
    """The C sources by file name."""
    root = files("rollbank.sandbox.local").joinpath("csrc")
    return {name: root.joinpath(name).read_bytes() for name in SOURCES}


def _digest(srcs: dict[str, bytes]) -> str:
    h = hashlib.sha256(" ".join(CFLAGS).encode())
    for name, data in sorted(srcs.items()):
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:12]


def helper_path() -> Path | None:
    """The compiled helper, building it the first time; None when no C compiler exists."""
    srcs = sources()
    target = cache_dir() / "bin" / f"rb-helper-{_digest(srcs)}"
    if os.access(target, os.X_OK):
        return target
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        for name, data in srcs.items():
            (Path(tmp) / name).write_bytes(data)
        out = Path(tmp) / "rb-helper"
        units = [str(Path(tmp) / n) for n in SOURCES if n.endswith(".c")]
        proc = subprocess.run([cc, *CFLAGS, "-o", str(out), *units],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SandboxError(f"rb-helper does not compile with {cc} {' '.join(CFLAGS)}: "
                               f"{proc.stderr.strip()[-2000:]}")
        out.rename(target)
    return target
