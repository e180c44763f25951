"""Verifier isolation on REAL sandboxes: a pinned command (the verifier) runs on the task's
pristine toolchain whatever the agent did to it, and sees the agent's work everywhere else.

Each test plants the agent's change first and checks it is visible to an ordinary command
(the control), then that the pinned command does not see it (or does, for work products).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from rollbank.episodes.probes import CHEATS, probe_built
from rollbank.episodes.verifier import TOOLCHAIN_PINS, run_oracle, run_verifier
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.protocol import Sandbox, SandboxSpec
from rollbank.tasks.builder import EnvironmentBuilder
from rollbank.tasks.loader import load_tasks

pytestmark = pytest.mark.integration

TROJAN = ('p="$(command -v pytest)" && printf \'#!/bin/sh\\necho TROJAN\\nexit 0\\n\' > "$p" && '
          'chmod +x "$p"')


async def eventually(sb: Sandbox, command: str, ok: Callable[[str], bool]) -> str:
    """``command``'s stdout once ``ok`` holds for it (a background process of the sandbox
    got to run on a loaded host), or the last one after a generous bound (~30 s)."""
    out = ""
    for _ in range(300):
        if ok(out := (await sb.exec(command)).stdout):
            break
        await asyncio.sleep(0.1)
    return out


async def start(backend: LocalBackend, base: Path) -> LocalSandbox:
    sb = await backend.start(SandboxSpec(layers=(base,)))
    assert isinstance(sb, LocalSandbox) and sb.can_pin
    return sb


async def test_pinned_command_runs_the_pristine_pytest_not_the_agents(backend: LocalBackend,
                                                                      base: Path) -> None:
    sb = await start(backend, base)
    assert (await sb.exec(f"{TROJAN} && pytest --version")).stdout == "TROJAN\n"  # control
    r = await sb.exec_pinned('pytest --version 2>&1; head -c 2 "$(command -v pytest)"',
                             pins=TOOLCHAIN_PINS)
    assert "TROJAN" not in r.stdout and r.stdout.startswith("pytest "), r
    assert r.stdout.endswith("#!")  # the real script
    assert (await sb.exec("pytest --version")).stdout == "TROJAN\n"  # the agent's state is kept


async def test_pinned_command_sees_the_agents_work_and_its_own_writes_stay_private(
        backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    await sb.exec("mkdir -p /app && echo work > /app/out.txt && echo mine > /usr/local/bin/extra")
    r = await sb.exec_pinned("cat /app/out.txt; ls /usr/local/bin/extra 2>&1 | grep -c 'No such';"
                             " echo scratch > /usr/local/bin/scratch && echo wrote; echo v > /app/v",
                             pins=TOOLCHAIN_PINS)
    assert r.stdout == "work\n1\nwrote\n", r  # work visible, /usr pristine and writable
    after = await sb.exec("cat /app/v; ls /usr/local/bin/extra /usr/local/bin/scratch 2>&1")
    lines = after.stdout.splitlines()
    assert lines[0] == "v" and "/usr/local/bin/extra" in lines  # outside the pins: the agent's
    assert "scratch': No such file" in after.stdout  # the pinned write was thrown away


async def test_files_planted_at_the_root_are_hidden_from_the_pinned_command(
        backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    await sb.exec("printf '[pytest]\\naddopts = -p evil\\n' > /pytest.ini; "
                  "printf 'import os\\nos._exit(0)\\n' > /conftest.py; echo x > /tmp/target; "
                  "ln -s /tmp/target /setup.cfg; mkdir -p /data && echo keep > /data/d")
    assert (await sb.exec("cat /conftest.py")).stdout.startswith("import os")  # control
    r = await sb.exec_pinned("for f in /pytest.ini /conftest.py /setup.cfg; do "
                             "[ -e $f ] || [ -L $f ] && echo FILE $f; done; cat /data/d /tmp/target",
                             pins=TOOLCHAIN_PINS)
    assert "FILE" not in r.stdout, r  # not in the verifier's root at all
    assert r.stdout.split() == ["keep", "x"]  # agent dirs and other files stay


async def test_loader_and_python_config_are_pinned(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    await sb.exec("d=$(python3 -m site --user-site); mkdir -p $d && "
                  "echo 'print(\"USERSITE\")' > $d/usercustomize.py; "
                  "for d in /etc/python3*; do echo 'print(\"HOOKED\")' > $d/sitecustomize.py; done;"
                  " echo /tmp/evil.so > /etc/ld.so.preload")
    plain = await sb.exec("python3 -c pass 2>&1")
    assert "HOOKED" in plain.stdout and "USERSITE" in plain.stdout  # control: both active
    r = await sb.exec_pinned("python3 -c pass 2>&1; wc -c < /etc/ld.so.preload",
                             pins=TOOLCHAIN_PINS, env={"PYTHONNOUSERSITE": "1"})
    assert r.stdout.split() == ["0"], r


async def test_the_pinned_view_is_private_to_the_pinned_command(backend: LocalBackend,
                                                                base: Path) -> None:
    """A process the agent left running (a service) keeps its own view: it cannot reach the
    verifier's pristine mounts, and the pinned command cannot change its files under /usr."""
    sb = await start(backend, base)
    await sb.exec(TROJAN)
    await sb.exec("nohup sh -c 'while :; do head -c 60 \"$(command -v pytest)\" > /tmp/seen;"
                  " sleep 0.05; done' >/dev/null 2>&1 &")
    r = await sb.exec_pinned('sleep 0.3; grep -c TROJAN "$(command -v pytest)"', pins=TOOLCHAIN_PINS)
    assert r.stdout == "0\n"
    seen = await eventually(sb, "cat /tmp/seen", lambda out: "TROJAN" in out)
    assert "TROJAN" in seen  # the service's view
    r = await sb.exec("ls -A /dev/.rollbank-pristine; umount /dev/.rollbank-pristine 2>&1 || echo denied")
    assert r.stdout.strip().endswith("denied") and "usr" not in r.stdout


async def test_a_wrecked_toolchain_directory_is_a_failed_command_not_a_runtime_error(
        backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    await sb.exec("rm -rf /etc/alternatives && echo x > /etc/alternatives")
    r = await sb.exec_pinned("echo ran", pins=TOOLCHAIN_PINS)
    assert r.exit_code == 126 and "/etc/alternatives" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("cheat", ["trojan_test_runner", "pytest_config_hijack"])
async def test_toolchain_cheats_no_longer_pass(backend: LocalBackend, cheat: str) -> None:
    """The two loopholes `tasks validate --probe` found on every very-easy task: before the
    fix both passed (the verifier ran the agent's toolchain); the oracle still passes."""
    task = next(t for t in load_tasks(["terminal-lite"]) if t.task_id == "hello-greeting")
    rep = await probe_built(task, backend, EnvironmentBuilder(),
                            cheats=[c for c in CHEATS if c.name == cheat])
    assert rep.oracle is not None and rep.oracle.passed
    (run,) = rep.cheats
    assert run.error is None and run.status == "fail", run
    assert rep.loopholes == [] and rep.ok


async def test_the_verifier_itself_reports_that_it_ran_pinned(backend: LocalBackend) -> None:
    task = next(t for t in load_tasks(["terminal-lite"]) if t.task_id == "count-lines")
    from rollbank.episodes.sandboxes import spec_for

    sb = await backend.start(spec_for(task, EnvironmentBuilder().build(task)))
    await run_oracle(sb, task)
    result = await run_verifier(sb, task, kill_leftovers=True)
    assert result.passed and result.pinned


HYDRA = r"""cat > /tmp/hydra.sh <<'X'
sleep 0.005
mkdir -p /logs/verifier /tests
echo 1 > /logs/verifier/reward.txt
printf 'def test_ok():\n    pass\n' > /tests/test_outputs.py 2>/dev/null
sh /tmp/hydra.sh &
X
for i in 1 2 3 4; do nohup setsid sh /tmp/hydra.sh >/dev/null 2>&1 < /dev/null & done; sleep 0.3"""


async def test_a_leftover_that_keeps_forking_cannot_tamper_with_the_verification(
        backend: LocalBackend) -> None:
    """#13 item 4: a background process left by the agent that rewrites the reward file and
    the tests, and keeps replacing itself by a fresh pid (a scan of /proc misses the new
    copies), must not produce a pass for a task that declares no service."""
    task = next(t for t in load_tasks(["terminal-lite"]) if t.task_id == "hello-greeting")
    from rollbank.episodes.sandboxes import spec_for

    sb = await backend.start(spec_for(task, EnvironmentBuilder().build(task)))
    assert isinstance(sb, LocalSandbox)
    await sb.exec(HYDRA)
    alive = await eventually(
        sb, "cat /logs/verifier/reward.txt 2>/dev/null || echo none; ps -eo args | grep -c hydra",
        lambda out: out.split()[0] == "1" and int(out.split()[1]) >= 2)
    assert alive.split()[0] == "1" and int(alive.split()[1]) >= 2  # control
    result = await run_verifier(sb, task, kill_leftovers=not task.services)
    assert result.status.value == "fail" and result.reward == 0.0, result
    # the pinned verifier keeps the agent's processes (as Harbor does): it is not killing
    # them that keeps them out of its view
    left = await sb.exec("ps -eo args | grep -v grep | grep -c hydra")
    assert left.stdout.strip() != "0"


async def test_a_live_service_cannot_rewrite_the_tests_or_the_reward(backend: LocalBackend) -> None:
    """Tasks that declare a service keep the agent's processes alive during verification; the
    verifier's /tests and /logs/verifier are private to it, so a live writer of reward 1 and
    of a passing test file cannot turn a no-op into a pass (it did before)."""
    task = next(t for t in load_tasks(["terminal-lite"]) if t.task_id == "hello-greeting")
    from rollbank.episodes.sandboxes import spec_for

    sb = await backend.start(spec_for(task, EnvironmentBuilder().build(task)))
    await sb.exec("nohup setsid sh -c 'while :; do mkdir -p /logs/verifier /tests; "
                  "echo 1 > /logs/verifier/reward.txt; printf \"def test_ok():\\n    pass\\n\" "
                  "> /tests/test_outputs.py; sleep 0.01; done' >/dev/null 2>&1 < /dev/null &")
    result = await run_verifier(sb, task, kill_leftovers=False)
    assert result.status.value == "fail" and result.reward == 0.0 and result.pinned, result
    # (read until the writer is not between its truncation and its write)
    still = await eventually(sb, "cat /logs/verifier/reward.txt", lambda out: out == "1\n")
    assert still == "1\n"  # control: the writer ran all along, in the sandbox's own view
