"""How ``rb-helper`` failed before the command ran (:mod:`~rollbank.sandbox.local.helper`).

When the runtime (not the command) fails, the helper writes ``rb-helper: WHAT: ERRNO TEXT`` and
exits 125. One such failure is the model's, decided by the kernel's counter, not the message:
the command could not be forked while the sandbox's ``pids.events`` ``max`` counter rose (its
processes hold every pid its limit allows): the command's result (``exec``: exit 126,
``pids_limit_hit``). With the counter unmoved (the host out of pids: ``kernel.pid_max`` /
``threads-max``) the same ``fork`` failure stays the runtime's.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollbank.sandbox.local.proc import ProcessResult

FAILURE_PREFIX = b"rb-helper: "  # then what failed; the exit status is 125
_FORK_FAILED = FAILURE_PREFIX + b"fork: "


class HelperFailure(enum.Enum):
    """How rb-helper failed before the command ran (see the module docstring)."""

    RUNTIME = "runtime"  # the sandbox runtime failed: infra (SandboxError)
    PIDS_LIMIT = "pids_limit"  # the sandbox's own processes hold every pid its limit allows


def helper_failure(returncode: int, stderr_head: bytes, pids_refusals: int) -> HelperFailure | None:
    """None: the exit status is the command's. ``pids_refusals``: how many forks the sandbox's
    pids cgroup refused during the command (the kernel's ``pids.events`` ``max`` delta)."""
    if returncode != 125 or not stderr_head.startswith(FAILURE_PREFIX):
        return None
    if stderr_head.startswith(_FORK_FAILED) and pids_refusals > 0:
        return HelperFailure.PIDS_LIMIT
    return HelperFailure.RUNTIME


def failure_of(res: ProcessResult) -> HelperFailure | None:
    """:func:`helper_failure` of one command run through the helper."""
    return helper_failure(res.returncode, bytes(res.stderr.head[:64]),
                          res.bill.pids_hits if res.bill else 0)


NO_PID = "rollbank: cannot start the command: the sandbox's processes hold every pid its limit allows\n"
