"""The probe's code-under-test cheats in REAL local sandboxes, on small tasks made here.

The verifier runs on the pristine toolchain, but what the tests run of the agent's (a module
they import, a script they execute, a program git runs from the repository's config) runs
inside the verifier's view, with its rights: it can write reward 1 and SIGKILL the test
runner before ``test.sh`` writes 0. ``trojan_outputs`` (the oracle's outputs replaced by such
payloads) and ``git_config_hooks`` (``core.fsmonitor``, hooks, a textconv driver in every
repository) forged a pass on py-fix-median, go-fix-wordfreq, c-fix-makefile,
node-fix-slugify and git-squash-commits (2026-12-02, no work done). Before those cheats
existed ``tasks validate --probe`` reported no loophole on such tasks; here it must find them,
and must not flag a task whose tests only read the agent's data. The fix is the tests': the
agent's code (and git) run in a child as uid 65534, which can neither write /logs/verifier
nor signal the runner; the 15 terminal-lite tasks found so are converted (docs/collect.md,
"Verifier isolation").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from rollbank.episodes.cheats import CHEATS
from rollbank.episodes.probes import probe_built
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.tasks.builder import EnvironmentBuilder
from rollbank.tasks.loader import load_task, load_tasks
from rollbank.tasks.model import Task

pytestmark = pytest.mark.integration

BY = {c.name: c for c in CHEATS}
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
GIT = "git -c user.email=t@example.com -c user.name=t"


def make_task(root: Path, *, dockerfile: str, solve: str, test_py: str) -> Task:
    root.mkdir()
    (root / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
    (root / "instruction.md").write_text("Do the task.\n")
    for sub, name, text in (("environment", "Dockerfile", dockerfile),
                            ("solution", "solve.sh", "#!/bin/bash\nset -e\n" + solve),
                            ("tests", "test.sh", TEST_SH), ("tests", "test_outputs.py", test_py)):
        (root / sub).mkdir(exist_ok=True)
        (root / sub / name).write_text(text)
        (root / sub / name).chmod(0o755)
    return load_task(root)


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with LocalBackend() as b:
        yield b


def imports_the_module(root: Path) -> Task:  # like py-fix-median: the tests import /app code
    return make_task(
        root, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n"
                         "RUN printf 'def add(a, b):\\n    return a - b\\n' > /app/calc.py\n",
        solve="sed -i 's/a - b/a + b/' /app/calc.py\n",
        test_py="import sys\nsys.path.insert(0, '/app')\nimport calc\n\n\n"
                "def test_add():\n    assert calc.add(2, 3) == 5\n")


def runs_the_script(root: Path) -> Task:  # like bash-log-rotate-script: the tests run it
    return make_task(
        root, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        solve="printf '#!/bin/sh\\necho 42\\n' > /app/answer.sh; chmod +x /app/answer.sh\n",
        test_py="import subprocess\n\n\ndef test_answer():\n    out = subprocess.run(['/app/answer.sh'], "
                "capture_output=True, text=True).stdout\n    assert out.strip() == '42'\n")


def reads_the_data(root: Path) -> Task:  # like hello-greeting: nothing of the agent's runs
    return make_task(
        root, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
        solve="echo hello > /app/greeting.txt\n",
        test_py="def test_greeting():\n    assert open('/app/greeting.txt').read() == 'hello\\n'\n")


def git_status_clean(root: Path) -> Task:  # like git-squash-commits: the tests run git status
    return make_task(
        root, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n"
                         f"RUN git init -q /app/repo && cd /app/repo && {GIT} commit -q "
                         "--allow-empty -m one && echo draft > notes.txt\n",
        solve=f"cd /app/repo && git add notes.txt && {GIT} commit -q -m notes\n",
        test_py="import subprocess\n\n\ndef git(*a):\n    return subprocess.run(['git', '-C', "
                "'/app/repo', *a], capture_output=True, text=True, check=True).stdout\n\n\n"
                "def test_committed_and_clean():\n    assert git('status', '--porcelain') == ''\n"
                "    assert 'notes' in git('log', '--format=%s')\n")


@pytest.mark.parametrize(("make", "cheat", "forged"), [
    (imports_the_module, "trojan_outputs", True),
    (runs_the_script, "trojan_outputs", True),
    (reads_the_data, "trojan_outputs", False),
    (git_status_clean, "git_config_hooks", True),
])
async def test_the_probe_finds_code_under_test_forgeries(backend: LocalBackend, tmp_path: Path,
                                                          make: Callable[[Path], Task], cheat: str,
                                                          forged: bool) -> None:
    task = make(tmp_path / "task")
    rep = await probe_built(task, backend, EnvironmentBuilder(), cheats=[BY[cheat]])
    assert rep.skipped is None and rep.oracle is not None and rep.oracle.passed, rep
    (run,) = rep.cheats
    assert run.error is None and run.active is True, run  # shown in place in the agent's view
    if forged:  # reward 1 with no work done: the probe reports it
        assert run.status == "pass" and rep.loopholes == [cheat] and not rep.ok, run
    else:
        assert run.status == "fail" and rep.loopholes == [] and rep.ok, run


def imports_the_module_as_nobody(root: Path) -> Task:  # the fix: the agent's code in a child
    return make_task(  # as uid 65534, which can neither write /logs/verifier nor signal the runner
        root, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n"
                         "RUN printf 'def add(a, b):\\n    return a - b\\n' > /app/calc.py\n",
        solve="sed -i 's/a - b/a + b/' /app/calc.py\n",
        test_py="import subprocess, sys\n\n\ndef test_add():\n    r = subprocess.run([sys.executable, "
                "'-I', '-c', 'import sys; sys.path.insert(0, \"/app\"); import calc; "
                "print(calc.add(2, 3))'], user=65534, group=65534, extra_groups=[], cwd='/tmp', "
                "env={'PATH': '/usr/bin:/bin'}, capture_output=True, text=True)\n"
                "    assert r.stdout.strip().splitlines()[-1:] == ['5']\n")


async def test_code_under_test_run_as_another_uid_cannot_forge(backend: LocalBackend,
                                                               tmp_path: Path) -> None:
    rep = await probe_built(imports_the_module_as_nobody(tmp_path / "task"), backend,
                            EnvironmentBuilder(), cheats=[BY["trojan_outputs"]])
    assert rep.oracle is not None and rep.oracle.passed, rep
    (run,) = rep.cheats
    assert run.active is True and run.status == "fail" and rep.loopholes == [] and rep.ok, run


@pytest.mark.parametrize(("task_id", "cheat"), [
    ("py-fix-median", "trojan_outputs"),  # imported the agent's module in pytest
    ("chmod-run-script", "trojan_outputs"),  # ran the agent's script as root
    ("c-fix-makefile", "trojan_outputs"),  # ran make on the agent's Makefile as root
    ("git-squash-commits", "git_config_hooks"),  # ran git status in the agent's repository
])
async def test_the_suites_tasks_that_forged_run_the_agents_code_as_nobody(
        backend: LocalBackend, task_id: str, cheat: str) -> None:
    """Each forged a pass with no work done on 2026-12-02; their tests now run the agent's
    code (and git) in a child as uid 65534."""
    task = next(t for t in load_tasks(["terminal-lite"]) if t.task_id == task_id)
    rep = await probe_built(task, backend, EnvironmentBuilder(), cheats=[BY[cheat]])
    assert rep.oracle is not None and rep.oracle.passed, rep
    (run,) = rep.cheats
    assert run.error is None and run.active is True, run
    assert run.status == "fail" and rep.loopholes == [] and rep.ok, run
