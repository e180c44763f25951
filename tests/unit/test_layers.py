"""The package's parts import one way: down the layer order of docs/architecture.md.

A part is a subpackage or a top-level module of ``rollbank``. A part may import itself and
any part in a lower layer; never a part in its own layer (peers stay independent) or above.
Imports under ``if TYPE_CHECKING:`` are not run and do not count for the layers. The folder
order in docs/architecture.md is this order.

No two files import each other, through any chain, inside a part too (:func:`test_no_module_cycles`):
there every import counts — module level, inside functions (lazy) and under ``TYPE_CHECKING``
(a cycle only typing closes is still two files that cannot be read apart).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "rollbank"
#: The benchmarks' package (rollbank-bench, a sibling distribution in this repository).
BENCH = Path(__file__).resolve().parents[2] / "bench" / "src" / "rollbank_bench"

# Bottom first. Parts in one tuple are peers.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("extras",),
    ("clock", "signals", "memory", "atomic", "listen"),
    ("config",),
    ("quantiles",),
    ("sandbox", "inference", "routing"),
    ("chat",),
    ("gateway",),
    ("tasks",),
    ("episodes",),
    ("agents",),
    ("batching",),
    ("staleness",),
    ("scheduling",),
    ("metrics",),
    ("collect_config",),
    ("task_selection",),
    ("inference_plane",),
    ("resume",),
    ("collector",),
    ("training", "evaluation", "service"),
    ("numerics",),
    ("cli", "integrations", "api"),  # api: what rollbank exports (re-exports, loaded lazily)
]
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}
TOP_LEVEL_EXTRAS = {"__init__", "__main__", "py"}  # rollbank/__init__.py and friends


def _parts() -> list[str]:
    names = []
    for p in SRC.iterdir():
        if p.name.startswith((".", "_")) or p.name in ("configs", "py.typed"):
            continue
        if p.is_dir() and (p / "__init__.py").exists():
            names.append(p.name)
        elif p.suffix == ".py":
            names.append(p.stem)
    return names


def _module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph(root: Path) -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    """The package's files by module name, and each file's imports of the package's files
    (the first line that imports each); every import counts. ``from pkg import name`` is
    pkg/name.py when that file exists, else pkg/__init__.py."""
    files = {_module_name(root, p): p for p in root.rglob("*.py") if "suites" not in p.parts}
    edges: dict[str, dict[str, int]] = {}
    for me, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found: list[tuple[int, str, tuple[str, ...]]]
            if isinstance(node, ast.Import):
                found = [(node.lineno, a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [(node.lineno, node.module, tuple(a.name for a in node.names))]
            else:
                continue
            for line, mod, names in found:
                for target in [f"{mod}.{n}" for n in names if f"{mod}.{n}" in files] or [mod]:
                    while target and target not in files:
                        target = target.rpartition(".")[0]
                    if target and target != me:
                        edges.setdefault(me, {}).setdefault(target, line)
    return files, edges


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    nodes = sorted(set(edges) | {b for targets in edges.values() for b in targets})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    u = stack.pop()
                    on.discard(u)
                    comp.append(u)
                    if u == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def _runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(inner) for sub in node.body for inner in ast.walk(sub))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, m) for line, m in found if m.startswith("rollbank.")]


def test_every_part_has_a_layer() -> None:
    missing = sorted(set(_parts()) - set(RANK))
    assert not missing, f"parts without a layer in LAYERS (add them): {missing}"


def test_imports_point_down() -> None:
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "tasks" and "suites" in rel.parts:
            continue
        part = rel.parts[0].removesuffix(".py")
        if part not in RANK:
            continue
        for line, module in _runtime_imports(ast.parse(path.read_text())):
            target = module.split(".")[1]
            if target == part or target not in RANK:
                continue
            if RANK[target] >= RANK[part]:
                bad.append(f"{rel}:{line}: {part} imports {module} (layer of {target} is not below)")
    assert not bad, "imports that run up or across the layers:\n" + "\n".join(sorted(bad))


def test_cycle_finder_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "sub/__init__.py", "d.py"):
        (pkg / name).write_text("")
    (pkg / "sub" / "a.py").write_text("def f() -> None:\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.sub.a\n")
    (pkg / "c.py").write_text("from pkg import d\n")
    files, edges = _module_graph(pkg)
    assert "pkg.sub.a" in files and edges["pkg.c"] == {"pkg.d": 1}
    assert _cycles(edges) == [["pkg.sub.a", "pkg.sub.b"]]


@pytest.mark.parametrize("root", [SRC, BENCH], ids=["rollbank", "rollbank_bench"])
def test_no_module_cycles(root: Path) -> None:
    """No import cycle between files anywhere in the package, inside a part included."""
    files, edges = _module_graph(root)
    report = []
    for comp in _cycles(edges):
        members = set(comp)
        report.append("cycle: " + ", ".join(comp))
        report += [f"  {files[a].relative_to(root.parent)}:{line} -> {b}"
                   for a in comp for b, line in sorted(edges.get(a, {}).items()) if b in members]
    assert not report, "modules that import each other (split by role, or give one a protocol):\n" + "\n".join(report)


def test_importing_the_collect_config_loads_only_configs() -> None:
    code = (
        "import sys, rollbank.collect_config as c; "
        "print(sorted(m for m in sys.modules if m.startswith('rollbank')));"
        "print([m for m in ('httpx', 'pyarrow', 'torch', 'vllm') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"},
    ).stdout.splitlines()
    modules = eval(out[0])
    heavy = eval(out[1])
    assert not heavy, f"loading the config imports {heavy}"
    assert len(modules) <= 40, f"loading the config imports {len(modules)} rollbank modules: {modules}"
