"""rb-helper failures: the runtime's (infra), or a command the sandbox's own processes left
no pid for (the model's), decided by the kernel's pids.events counter, not the message."""

from __future__ import annotations

from rollbank.sandbox.local.helper_failure import HelperFailure, helper_failure

FORK = b"rb-helper: fork: Resource temporarily unavailable\n"


def test_the_commands_own_exit_status_is_no_helper_failure() -> None:
    assert helper_failure(0, b"", 0) is None
    assert helper_failure(125, b"my program says 125\n", 3) is None  # not the helper's line
    assert helper_failure(1, FORK, 3) is None  # the command printed it, with its own status


def test_a_fork_refused_by_the_sandboxs_pids_limit_is_the_commands_result() -> None:
    assert helper_failure(125, FORK, 1) is HelperFailure.PIDS_LIMIT


def test_a_fork_failure_the_sandboxs_counter_did_not_see_is_the_runtimes() -> None:
    # the host out of pids (kernel.pid_max / threads-max): the sandbox's limit refused nothing
    assert helper_failure(125, FORK, 0) is HelperFailure.RUNTIME


def test_other_runtime_failures_stay_the_runtimes_even_at_the_limit() -> None:
    for line in (b"rb-helper: setns: Invalid argument\n", b"rb-helper: anchor gone: No such process\n",
                 b"rb-helper: /sys/fs/cgroup/x/cgroup.procs: No such file or directory\n"):
        assert helper_failure(125, line, 5) is HelperFailure.RUNTIME
