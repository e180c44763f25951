"""Pure translations between Harbor's environment calls and rollbank's sandbox calls.

Owns how a Harbor ``exec(command, cwd, env, timeout_sec, user)`` becomes a rollbank argv and
how a rollbank :class:`~rollbank.sandbox.protocol.ExecResult` becomes Harbor's
``(stdout, stderr, return_code)``; which Harbor network modes rollbank can enforce; merging a
downloaded tree into an existing host directory. No Harbor import, no I/O except
:func:`merge_tree` (host files only).

Semantics (as Harbor's Docker environment has them)
- commands run under ``bash -c`` (Harbor's images always ship bash; rollbank's Debian bases do);
- ``user`` None, ``"root"``, ``0`` or ``"0"``: the sandbox's root, no switch; any other name or
  uid (``name:group``, ``uid:gid``): ``setpriv`` to that passwd entry with its ``HOME``, as
  ``docker exec -u`` does (:func:`rollbank.sandbox.local.user.as_user`). A user name the
  image does not have fails the command (exit 126) rather than running it as root;
- a command killed by a signal returns ``128 + signal`` (the shell convention); a timed-out
  command is an error (:class:`CommandTimeout`), as in Harbor's Docker environment.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rollbank.sandbox.local.user import as_user
from rollbank.sandbox.protocol import ExecResult

#: Harbor network modes (``NetworkMode`` values) rollbank enforces: no network = loopback only;
#: public = the host's network. Allowlists need an egress filter rollbank does not have.
SUPPORTED_NETWORK_MODES = frozenset({"no-network", "public"})


class CommandTimeout(RuntimeError):
    """A command ran past its ``timeout_sec`` and was killed (Harbor's Docker contract)."""


def is_root(user: str | int | None) -> bool:
    return user is None or str(user) in ("root", "0")


def command_argv(command: str, user: str | int | None) -> list[str]:
    """The argv that runs Harbor's ``command`` as ``user`` inside the sandbox."""
    if is_root(user):
        return ["/bin/bash", "-c", command]
    return as_user(str(user), ["/bin/bash", "-c", command])


@dataclass(frozen=True)
class HarborResult:
    stdout: str
    stderr: str
    return_code: int


def harbor_result(res: ExecResult, *, timeout_sec: float | None) -> HarborResult:
    """Harbor's view of a finished command (raises :class:`CommandTimeout` on a timeout)."""
    if res.timed_out or res.budget_exhausted:
        raise CommandTimeout(f"Command timed out after {timeout_sec} seconds")
    if res.host_stalled:
        raise RuntimeError("rollbank: the host stalled the command past its limit "
                           f"({res.stall_s:.1f} s not billed); the trial is an infra failure")
    if res.exit_code is not None:
        code = res.exit_code
    elif res.signal is not None:
        code = 128 + res.signal
    else:
        code = 1
    return HarborResult(res.stdout, res.stderr, code)


def network_enabled(mode: str) -> bool:
    """Whether a sandbox for Harbor network ``mode`` gets the host's network (else loopback)."""
    if mode not in SUPPORTED_NETWORK_MODES:
        raise ValueError(f"network_mode={mode!r} is not supported by the rollbank environment "
                         f"(supported: {', '.join(sorted(SUPPORTED_NETWORK_MODES))})")
    return mode == "public"


def merge_tree(src: Path, dst: Path) -> None:
    """Copy the contents of directory ``src`` into ``dst`` (created; existing files replaced,
    other files of ``dst`` kept), as ``docker cp SRC/. DST`` does."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
