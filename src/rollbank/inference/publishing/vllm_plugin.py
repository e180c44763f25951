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
- apply: like vLLM's checkpoint-format engines, ``start`` opens a layerwise reload and
  ``finish`` finalizes it, so CPU kernels that repack weights after loading see the new ones.

Registration: vLLM loads every entry point of the ``vllm.general_plugins`` group in each of
its processes (API server, engine core, workers; ``VLLM_PLUGINS`` may restrict them by name).
rollbank declares ``rollbank_shm = "rollbank.inference.publishing.vllm_plugin:register"`` in
its ``pyproject.toml``, so the backend exists wherever rollbank is installed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKEND = "rollbank_shm"


def check_installed() -> None:
    """Raise :class:`ConfigError` unless vLLM will find the backend's entry point."""
    from importlib.metadata import entry_points

    from rollbank.errors import ConfigError

    if not any(ep.name == BACKEND for ep in entry_points(group="vllm.general_plugins")):
        raise ConfigError(
            f"the {BACKEND!r} weight-transfer backend is not registered with vLLM: reinstall "
            "rollbank into this environment (pip install --no-deps -e <repo>) so its "
            "vllm.general_plugins entry point exists", field="weight_transfer_backend")


def register() -> None:
    """vLLM general-plugin hook: register the backend (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "SharedMemoryWeightTransferEngine")


def __getattr__(name: str) -> Any:  # the engine class is built on first use (vLLM import)
    if name == "SharedMemoryWeightTransferEngine":
        cls = _engine_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def _engine_class() -> type[Any]:
    import torch
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    from rollbank.inference.publishing.shm import SHM_DIR, ShmLayout, map_file, views

    logger = init_logger("vllm.rollbank_shm")  # under "vllm": printed in the server log

    @dataclass
    class ShmInitInfo(WeightTransferInitInfo):  # type: ignore[misc]
        directory: str = str(SHM_DIR)

    @dataclass
    class ShmUpdateInfo(WeightTransferUpdateInfo):  # type: ignore[misc]
        path: str
        names: list[str]
        dtype_names: list[str]
        shapes: list[list[int]]
        offsets: list[int]
        nbytes: int
        extra: dict[str, Any] = field(default_factory=dict)

    class SharedMemoryWeightTransferEngine(WeightTransferEngine):  # type: ignore[misc]
        init_info_cls = ShmInitInfo
        update_info_cls = ShmUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info: Any) -> None:
            self.directory = Path(init_info.directory).resolve()

        def start_weight_update(self) -> None:
            initialize_layerwise_reload(self.model)

        def update_weights(self, update_info: dict[str, Any]) -> None:
            # The base class ends with torch.accelerator.synchronize(), which raises on a
            # CPU-only host; loading here is synchronous, so there is nothing to wait for.
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info: Any) -> None:
            directory = getattr(self, "directory", SHM_DIR.resolve())
            path = Path(update_info.path).resolve()
            if path.parent != directory:
                raise ValueError(f"{path} is outside the weight-transfer directory {directory}")
            layout = ShmLayout(
                update_info.names, update_info.dtype_names, update_info.shapes,
                update_info.offsets, update_info.nbytes,
            )
            t0 = time.perf_counter()
            buf = map_file(path, layout.nbytes, writable=False)
            with torch.no_grad():
                self.model.load_weights(views(buf, layout))
            logger.info("rollbank_shm: loaded %d tensors (%d bytes) in %.1f ms",
                        len(layout.names), layout.nbytes, 1e3 * (time.perf_counter() - t0))

        def finish_weight_update(self) -> None:
            finalize_layerwise_reload(self.model, self.model_config)

        def shutdown(self) -> None:
            pass

    return SharedMemoryWeightTransferEngine
