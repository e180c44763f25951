"""docs/benchmarks.md is what scripts/benchmarks_page.py makes of docs/measurements/*.json."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "benchmarks_page.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmarks_page", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks_page"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_page_is_what_the_json_gives() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_figure_without_json_behind_it_is_an_error() -> None:
    mod = _module()
    doc = {"arms": [{"name": "a", "wall_s": 1.5}], "x": {"y": 2}}
    assert mod.resolve(doc, "arms[name=a].wall_s") == 1.5
    assert mod.resolve(doc, "arms[0].name") == "a"
    with pytest.raises(mod.MissingFigure):
        mod.resolve(doc, "x.z")
    with pytest.raises(mod.MissingFigure):
        mod.resolve(doc, "arms[name=b].wall_s")


def test_every_section_reads_an_existing_measurement_file() -> None:
    mod = _module()
    for section in mod.SECTIONS:
        assert (mod.MEASUREMENTS / section.source).is_file(), section.source
        assert section.regime, section.title


def test_an_edited_figure_in_the_page_fails_the_check(tmp_path: Path) -> None:
    mod = _module()
    page = tmp_path / "benchmarks.md"
    page.write_text(mod.render().replace("| faults injected | 527 |", "| faults injected | 600 |"))
    setattr(mod, "PAGE", page)  # noqa: B010
    assert mod.main(["--check"]) == 1
    page.write_text(mod.render())
    assert mod.main(["--check"]) == 0


def test_a_figure_removed_from_its_json_fails_the_check(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The whole check (as the suite runs it) fails when a figure the page shows has no JSON."""
    import json
    import shutil

    mod = _module()
    measurements = tmp_path / "measurements"
    shutil.copytree(mod.MEASUREMENTS, measurements)
    section = mod.SECTIONS[0]
    doc = json.loads((measurements / section.source).read_text())
    head, _, leaf = section.figs[0].path.rpartition(".")
    parent = mod.resolve(doc, head) if head else doc
    del parent[leaf]
    (measurements / section.source).write_text(json.dumps(doc))
    setattr(mod, "MEASUREMENTS", measurements)  # noqa: B010
    assert mod.main(["--check"]) == 1
    assert "no JSON behind it" in capsys.readouterr().err
