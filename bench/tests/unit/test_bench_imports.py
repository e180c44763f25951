"""The benchmarks import only what rollbank exports (``rollbank.api``): its names, or the
public names of the modules it lists as instrumented (``rollbank.api.INSTRUMENTED``) — never
a private name, never an unlisted module."""

from __future__ import annotations

import ast
from pathlib import Path

from rollbank import api

BENCH = Path(__file__).resolve().parents[2] / "src" / "rollbank_bench"


def violations(source: str, where: str) -> list[str]:
    """Each import of rollbank in ``source`` that the public surface does not allow."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad += [f"{where}:{node.lineno}: import {a.name} (use from-imports of public names)"
                    for a in node.names if a.name.startswith("rollbank.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mod = node.module
            if mod != "rollbank" and not mod.startswith("rollbank."):
                continue
            if mod == "rollbank.api":
                bad += [f"{where}:{node.lineno}: rollbank.api has no {a.name}"
                        for a in node.names if a.name not in api.EXPORTS]
            elif mod not in api.INSTRUMENTED:
                bad.append(f"{where}:{node.lineno}: {mod} is not in rollbank.api.INSTRUMENTED")
            else:
                bad += [f"{where}:{node.lineno}: private name {mod}.{a.name}"
                        for a in node.names if a.name.startswith("_")]
    return bad


def test_the_benchmarks_import_only_the_public_surface() -> None:
    bad = [v for p in sorted(BENCH.rglob("*.py"))
           for v in violations(p.read_text(encoding="utf-8"), str(p.relative_to(BENCH.parent)))]
    assert not bad, "imports outside rollbank's public surface:\n" + "\n".join(bad)


def test_the_check_refuses_private_names_and_unlisted_modules() -> None:
    assert violations("from rollbank.inference_plane import _vocab_size\n", "x")
    assert violations("from rollbank.service.hub import Hub\n", "x")
    assert violations("from rollbank.api import NoSuchName\n", "x")
    assert not violations("from rollbank.api import CollectConfig\n"
                          "from rollbank.inference_plane import vocab_size\n", "x")


def test_every_export_resolves_to_its_module() -> None:
    for name, module in api.EXPORTS.items():
        assert getattr(api, name) is getattr(__import__(module, fromlist=[name]), name), name
    assert sorted(api.__all__) == sorted(api.EXPORTS)
