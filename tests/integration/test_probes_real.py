"""Verifier-loophole probes on terminal-lite tasks, in REAL local sandboxes.

Every cheat must fail: outputs without the work, fake tests, a written reward, processes
left running, and the toolchain redirections of ``episodes/cheats.py`` (each first shown
active in the agent's own view). The trojan pytest and the rootdir hijack passed on every
very-easy task before the verifier ran on the task's pristine toolchain, and ``repoint_bin``
(issue 24) before its root was assembled from the pristine layers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rollbank.episodes.probes import CHEATS, probe_built
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.tasks.builder import EnvironmentBuilder
from rollbank.tasks.loader import load_tasks

pytestmark = pytest.mark.integration

GUARDED = {"empty_outputs", "placeholder_outputs", "fake_tests", "write_reward",
           "background_reward_writer", "kill_verifier_python", "trojan_test_runner",
           "pytest_config_hijack"}


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with LocalBackend() as b:
        yield b


REDIRECTS = {c.name for c in CHEATS if c.redirects}


@pytest.mark.parametrize(("task_id", "output"), [("hello-greeting", "/app/greeting.txt"),
                                                 ("count-lines", None),
                                                 ("rename-draft", None)])
async def test_oracle_passes_and_every_cheat_fails(backend: LocalBackend, task_id: str,
                                                     output: str | None) -> None:
    task = next(t for t in load_tasks(["terminal-lite"]) if t.task_id == task_id)
    # every cheat on one task; the state and process cheats (and two toolchain ones) on others
    # git_config_hooks needs a git repository in the image (hello-greeting has none: the
    # probe reports it inactive there); tests/integration/test_probe_code_under_test.py runs it
    wanted = GUARDED | (REDIRECTS - {"git_config_hooks"} if task_id == "hello-greeting" else set())
    rep = await probe_built(task, backend, EnvironmentBuilder(),
                            cheats=[c for c in CHEATS if c.name in wanted])
    assert rep.skipped is None
    assert rep.oracle is not None and rep.oracle.passed, rep.oracle
    assert rep.outputs, "the oracle's output files were not found"
    if output is not None:
        assert rep.outputs == [output]
    by_name = {c.name: c for c in rep.cheats}
    assert set(by_name) == wanted
    for name in wanted:
        c = by_name[name]
        assert c.error is None and not c.passed, (name, c)
        assert c.status is not None
        if name in REDIRECTS:  # shown active in the agent's view, then the no-op's verdict
            assert c.active is True and c.status == "fail", (name, c)
    assert rep.loopholes == [] and rep.reached == [] and rep.ok
