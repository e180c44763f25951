"""The scheduling part's folders by role: ``policy/`` is pure, so it imports no driver, no
simulator and no I/O library (asyncio, httpx, threads, subprocesses), at run time,
lazily or under ``TYPE_CHECKING``; the simulator imports no driver."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCHEDULING = Path(__file__).resolve().parents[2] / "src" / "rollbank" / "scheduling"
IO_MODULES = ("asyncio", "httpx", "threading", "subprocess", "socket", "concurrent")
# folder -> the module prefixes it must not import
FORBIDDEN = {
    "policy": ("rollbank.scheduling.drivers", "rollbank.scheduling.sim", *IO_MODULES),
    "sim": ("rollbank.scheduling.drivers", *IO_MODULES),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def violations(root: Path) -> list[str]:
    bad = []
    for folder, prefixes in FORBIDDEN.items():
        for path in sorted((root / folder).rglob("*.py")):
            for line, name in _imports(path):
                if any(name == p or name.startswith(p + ".") for p in prefixes):
                    bad.append(f"{path.relative_to(root)}:{line}: {name}")
    return bad


def test_the_checker_sees_a_lazy_driver_import_and_asyncio(tmp_path: Path) -> None:
    (tmp_path / "policy").mkdir()
    (tmp_path / "sim").mkdir()
    (tmp_path / "policy" / "a.py").write_text(
        "def f() -> None:\n    from rollbank.scheduling.drivers.driver import X\n")
    (tmp_path / "sim" / "b.py").write_text("import asyncio\n")
    (tmp_path / "sim" / "c.py").write_text("from rollbank.scheduling.policy.types import Launch\n")
    assert violations(tmp_path) == [
        "policy/a.py:2: rollbank.scheduling.drivers.driver", "sim/b.py:1: asyncio"]


@pytest.mark.parametrize("folder", ["policy", "drivers", "sim"])
def test_the_folders_exist(folder: str) -> None:
    assert (SCHEDULING / folder / "__init__.py").is_file()


def test_policy_and_sim_import_no_driver_and_no_io() -> None:
    assert not violations(SCHEDULING), "\n".join(violations(SCHEDULING))
