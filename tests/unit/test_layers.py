"""The package's parts import one way: down the layer order of docs/architecture.md.

A part is a subpackage or a top-level module of ``rollbank``. A part may import itself and
any part in a lower layer; never a part in its own layer (peers stay independent) or above.
Imports under ``if TYPE_CHECKING:`` are not run and do not count. The folder order in
docs/architecture.md is this order.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rollbank"

# Bottom first. Parts in one tuple are peers.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("extras",),
    ("clock", "signals", "memory"),
    ("config",),
    ("quantiles",),
    ("sandbox", "inference", "routing"),
    ("tasks",),
    ("episodes",),
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
    ("cli", "bench"),
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
