"""A CPU weight-transfer backend for vLLM's native RL weight-sync protocol.

vLLM 0.32 drives weight updates through ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights`` and ``/finish_weight_update`` (with a
``weight_version``), and delegates the transport to a ``WeightTransferEngine`` chosen by
``--weight-transfer-config '{"backend": ...}'`` from ``WeightTransferEngineFactory``. The
built-in backends (NCCL, CUDA IPC, ...) need a GPU; this module adds ``rollbank_shm``:

- data plane: the trainer writes the tensors into one ``/dev/shm`` file
  (:mod:`rollbank.inference.publishing.shm`); ``/update_weights`` carries its path and layout;
  the worker maps the file and calls ``model.load_weights`` on views of it (no copy before the
  load's own copy into the parameters);
- apply: like vLLM's checkpoint-format engines, loads go through a layerwise reload that is
  finalized afterwards, so CPU kernels that repack weights after loading see the new ones. The
  reload is opened by the first load, not by ``start``, so a session can be started and its
  buffer *staged* (copied into the worker: phase ``stage``) while the engine still generates;
  inside the pause only phase ``apply`` (load from the staged copy + finalize) and
  ``/finish_weight_update`` (the version label) remain.

Registration: vLLM loads every entry point of the ``vllm.general_plugins`` group in each of
its processes (API server, engine core, workers; ``VLLM_PLUGINS`` may restrict them by name).
rollbank declares ``rollbank_shm = "rollbank.inference.publishing.vllm_plugin:register"`` in
its ``pyproject.toml``, so the backend exists wherever rollbank is installed. The factory's
registry, the base classes and the layerwise reload are vLLM internals: they are reached
through :mod:`rollbank.inference.vllm_internals` (version and symbols checked at registration).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKEND = "rollbank_shm"


def check_installed() -> None:
    """Raise :class:`ConfigError` unless vLLM will find the backend's entry point (and
    :class:`~rollbank.errors.EngineVersionError` if the installed vLLM is outside the range
    whose internals the backend uses)."""
    from importlib.metadata import entry_points

    import rollbank.inference.vllm_internals  # noqa: F401  (the version check on import)
    from rollbank.errors import ConfigError

    if not any(ep.name == BACKEND for ep in entry_points(group="vllm.general_plugins")):
        raise ConfigError(
            f"the {BACKEND!r} weight-transfer backend is not registered with vLLM: reinstall "
            "rollbank into this environment (pip install --no-deps -e <repo>) so its "
            "vllm.general_plugins entry point exists", field="weight_transfer_backend")


def register() -> None:
    """vLLM general-plugin hook: check the vLLM version and the internals rollbank uses
    (:mod:`rollbank.inference.vllm_internals`: a typed error naming the supported range),
    then register the backend (idempotent)."""
    from rollbank.inference import vllm_internals

    vllm_internals.require_symbols(vllm_internals.PLUGIN_SYMBOLS)
    vllm_internals.register_weight_transfer_engine(BACKEND, __name__, "SharedMemoryWeightTransferEngine")


def __getattr__(name: str) -> Any:  # the engine class is built on first use (vLLM import)
    if name == "SharedMemoryWeightTransferEngine":
        cls = _engine_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _fmt(timings_ms: dict[str, float]) -> str:
    return "(" + ", ".join(f"{k} {v:.1f}" for k, v in timings_ms.items()) + ")"


def _engine_class() -> type[Any]:
    import torch

    from rollbank.inference import vllm_internals
    from rollbank.inference.publishing.shm import SHM_DIR, ShmLayout, map_file, views
    from rollbank.inference.publishing.staged_reload import StagedReload, vllm_layerwise_reload

    WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo = (
        vllm_internals.weight_transfer_bases())
    initialize_layerwise_reload, finalize_layerwise_reload = vllm_internals.layerwise_reload()
    logger = vllm_internals.logger("vllm.rollbank_shm")  # under "vllm": printed in the server log

    @dataclass
    class ShmInitInfo(WeightTransferInitInfo):  # type: ignore[misc,valid-type]
        directory: str = str(SHM_DIR)

    @dataclass
    class ShmUpdateInfo(WeightTransferUpdateInfo):  # type: ignore[misc,valid-type]
        path: str
        names: list[str]
        dtype_names: list[str]
        shapes: list[list[int]]
        offsets: list[int]
        nbytes: int
        extra: dict[str, Any] = field(default_factory=dict)

    class SharedMemoryWeightTransferEngine(WeightTransferEngine):  # type: ignore[misc,valid-type]
        init_info_cls = ShmInitInfo
        update_info_cls = ShmUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info: Any) -> None:
            self.directory = Path(init_info.directory).resolve()

        def start_weight_update(self) -> None:
            # Touches nothing: the layerwise reload (which moves layers to the meta device) is
            # opened by the first phase that loads the live model, so a session may be
            # started, and an update staged, while the engine still generates.
            self._opened = False
            self._staged: tuple[Path, ShmLayout, Any] | None = None
            if getattr(self, "_reloader", None) is not None:
                self._reloader.discard()

        def update_weights(self, update_info: dict[str, Any]) -> None:
            # The base class ends with torch.accelerator.synchronize(), which raises on a
            # CPU-only host; loading here is synchronous, so there is nothing to wait for.
            self.receive_weights(self.parse_update_info(update_info))

        def _open(self) -> None:
            if not getattr(self, "_opened", False):
                initialize_layerwise_reload(self.model)
                self._opened = True

        def _close(self) -> None:
            if getattr(self, "_opened", False):
                finalize_layerwise_reload(self.model, self.model_config)
                self._opened = False

        def _stage(self, path: Path, layout: ShmLayout, prepare: bool) -> None:
            """Before the pause. ``prepare``: reload the buffer into the shadow model (name
            mapping, dtype, fusing, the CPU GEMM repack: everything but the swap); else only
            copy the buffer into this process (the apply then reloads the live model)."""
            t0 = time.perf_counter()
            if not prepare:
                self._staged = (path, layout, map_file(path, layout.nbytes, writable=False).clone())
                logger.info("rollbank_shm: staged %d bytes in %.1f ms", layout.nbytes,
                            1e3 * (time.perf_counter() - t0))
                return
            if getattr(self, "_reloader", None) is None:
                self._reloader = StagedReload(self.model, vllm_layerwise_reload(self.model_config))
            plan = self._reloader.stage(views(map_file(path, layout.nbytes, writable=False), layout))
            self._staged = (path, layout, self._reloader)
            logger.info("rollbank_shm: prepared %d tensors (%d bytes) in %.1f ms %s; swap: %d "
                        "tensors (%d bytes), %d attributes", len(layout.names), layout.nbytes,
                        1e3 * (time.perf_counter() - t0), _fmt(self._reloader.timings_ms),
                        len(plan.copies), plan.nbytes, len(plan.attrs))

        def receive_weights(self, update_info: Any) -> None:
            """Phases (``extra["phase"]``): ``stage`` prepares the update before the pause
            (``extra["prepare"]``, default true: reloaded into the shadow model; false: the
            buffer copied into this process); ``apply`` installs the staged update (a swap
            when prepared, else a reload of the live model) and finalizes at once; ``load``
            (default) reloads the live model from the file and leaves the finalization to
            ``finish_weight_update``."""
            directory = getattr(self, "directory", SHM_DIR.resolve())
            path = Path(update_info.path).resolve()
            if path.parent != directory:
                raise ValueError(f"{path} is outside the weight-transfer directory {directory}")
            layout = ShmLayout(
                update_info.names, update_info.dtype_names, update_info.shapes,
                update_info.offsets, update_info.nbytes,
            )
            phase = str(update_info.extra.get("phase", "load"))
            t0 = time.perf_counter()
            if phase == "stage":
                self._stage(path, layout, bool(update_info.extra.get("prepare", True)))
                return
            if phase not in ("apply", "load"):
                raise ValueError(f"unknown rollbank_shm phase {phase!r}")
            staged = getattr(self, "_staged", None)
            self._staged = None
            match = staged is not None and staged[:2] == (path, layout)
            reloader = getattr(self, "_reloader", None)
            if match and staged is not None and isinstance(staged[2], StagedReload):
                if phase == "apply":  # the cheap step: in-place copies + attribute swaps
                    plan = staged[2].swap()
                    logger.info("rollbank_shm: apply %d tensors (%d bytes, swapped %d tensors, "
                                "%d attributes) in %.1f ms %s", len(layout.names), layout.nbytes,
                                len(plan.copies), len(plan.attrs), 1e3 * (time.perf_counter() - t0),
                                _fmt(staged[2].timings_ms))
                    return
                staged = None
                match = False
            if reloader is not None:
                reloader.discard()
            source = "staged" if match else "mapped"
            buf = staged[2] if staged is not None and match else \
                map_file(path, layout.nbytes, writable=False)
            with torch.no_grad():
                if layout.names:  # nothing changed: leave the layers where they are
                    self._open()
                    self.model.load_weights(views(buf, layout))
                t1 = time.perf_counter()
                if phase == "apply":
                    self._close()
            logger.info("rollbank_shm: %s %d tensors (%d bytes, %s) in %.1f ms (finalize %.1f ms)",
                        phase, len(layout.names), layout.nbytes, source, 1e3 * (t1 - t0), 1e3 * (time.perf_counter() - t1))

        def finish_weight_update(self) -> None:
            self._staged = None
            if getattr(self, "_reloader", None) is not None:
                self._reloader.discard()
            self._close()

        def shutdown(self) -> None:
            pass

    return SharedMemoryWeightTransferEngine
