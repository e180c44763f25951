"""vLLM's internals are touched from one module, which refuses an unknown vLLM with a typed error."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rollbank.errors import ConfigError, EngineVersionError
from rollbank.inference import vllm_internals
from rollbank.inference.vllm_internals import SUPPORTED_TEXT, check_version, parse_version

SRC = Path(__file__).resolve().parents[2] / "src" / "rollbank"
#: vLLM's public API: what any module may import from vLLM itself
PUBLIC = {"vllm": {"LLM", "SamplingParams"}}


def test_supported_versions_pass_and_others_are_refused_naming_the_range() -> None:
    for ok in ("0.32.0", "0.32.0+cpu", "0.32.5rc1", None):
        check_version(ok)
    for bad in ("0.31.9", "0.33.0", "1.0.0", "0.33.0+cpu"):
        with pytest.raises(EngineVersionError) as err:
            check_version(bad)
        assert bad in str(err.value) and SUPPORTED_TEXT in str(err.value)
        assert isinstance(err.value, ConfigError) and err.value.exit_code == 3
    assert parse_version("0.32.0+cpu") == (0, 32, 0)
    with pytest.raises(EngineVersionError, match="cannot read"):
        parse_version("nightly")


def test_the_installed_vllm_is_in_the_supported_range() -> None:
    """Importing the module checked it already; this says which version that was."""
    version = vllm_internals.installed_version()
    if version is None:
        pytest.skip("vLLM is not installed")
    low, high = vllm_internals.SUPPORTED
    assert low <= parse_version(version) < high


def test_a_missing_symbol_or_module_is_refused_naming_it() -> None:
    with pytest.raises(EngineVersionError, match=r"json\.no_such_name"):
        vllm_internals.require_symbols({"json": ("loads", "no_such_name")})
    with pytest.raises(EngineVersionError, match="the module rollbank_no_such_module"):
        vllm_internals.require_symbols({"rollbank_no_such_module": ("x",)})


def test_an_engine_without_an_attribute_is_refused_naming_its_path() -> None:
    class Runner:
        model = object()

    class Worker:
        model_runner = Runner()

    class Driver:
        worker = Worker()

    class Executor:
        driver_worker = Driver()

    class Engine:
        model_executor = Executor()

    vllm_internals.check_engine(Engine(), ["model_executor.driver_worker.worker.model_runner.model"])
    with pytest.raises(EngineVersionError, match=r"LLMEngine\.output_processor\.request_states"):
        vllm_internals.check_engine(Engine(), ["output_processor.request_states"])


def _vllm_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from vllm... import name`` / ``import vllm...`` in ``path``."""
    out: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "*") for a in node.names if a.name.split(".")[0] == "vllm"]
    return out


def test_no_other_module_reaches_into_vllm() -> None:
    """Regression (#25): staged_reload.py, vllm_plugin.py and colocated.py imported vLLM's
    private modules (the transfer factory's registry, the layerwise reload, LAYERWISE_INFO)."""
    offenders = []
    for f in sorted(SRC.rglob("*.py")):
        if f.name == "vllm_internals.py":
            continue
        for module, name in _vllm_imports(f):
            if name not in PUBLIC.get(module, set()):
                offenders.append(f"{f.relative_to(SRC)}: {module}.{name}")
    assert offenders == []
