"""The vLLM engine's control plane, as the client speaks it (vLLM 0.32; the routes need
``VLLM_SERVER_DEV_MODE=1``, which :mod:`rollbank.inference.server` sets).

Owns :class:`VLLMControl` (a base of :class:`~rollbank.inference.vllm_client.VLLMClient`):
the engine's version (``GET /weight_info``), pause/resume (``POST /pause?mode=&clear_cache=``,
``POST /resume``, ``GET /is_paused``), ``POST /reset_prefix_cache``, weights
(``POST /collective_rpc`` ``reload_weights`` then ``POST /update_weight_version``; vLLM's
native weight-sync routes), LoRA adapters and ``GET /metrics`` (Prometheus text).

``policy_version`` is the version the engine was last known to hold: set here after the
engine accepted a new label, or read by the client's ``connect``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from rollbank.errors import BadRequestError, InferenceError, WeightVersionError
from rollbank.inference.engine_output import parse_version_label, version_label
from rollbank.inference.protocol import PauseMode, ServerMetrics
from rollbank.inference.vllm_http import VLLMHttp
from rollbank.inference.vllm_wire import parse_prometheus


class VLLMControl(VLLMHttp):
    """Control-plane calls to one vLLM server; ``_version`` is its last known version."""

    _version: int = 0

    @property
    def policy_version(self) -> int:
        return self._version

    async def engine_version(self, request_id: str | None = None) -> int:
        """The version the engine serves now (``GET /weight_info``)."""
        try:
            resp = await self._send("GET", "/weight_info", request_id=request_id)
            label = resp.json()["weight_version"]
        except (BadRequestError, KeyError, TypeError, ValueError) as exc:
            raise WeightVersionError(
                f"{self._base_url} reports no weight version (GET /weight_info: {exc}); start it "
                "with VLLM_SERVER_DEV_MODE=1 (and --enable-scale-out for per-token versions)",
                server=self._base_url, request_id=request_id,
            ) from exc
        return parse_version_label(label, server=self._base_url, request_id=request_id)

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        params = {"mode": mode, "clear_cache": "true" if clear_cache else "false"}
        await self._send("POST", "/pause", params=params)

    async def resume(self) -> None:
        await self._send("POST", "/resume")

    async def is_paused(self) -> bool:
        resp = await self._send("GET", "/is_paused")
        return bool(resp.json()["is_paused"])

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None:
        """Reset; vLLM refuses while blocks are held (running requests), so retry briefly.
        ``reset_running_requests``: preempt running (or paused-in-place) requests so their KV
        is recomputed, which lets the reset succeed at once."""
        params = {"reset_running_requests": "true"} if reset_running_requests else None
        for i in range(attempts):
            resp = await self._send("POST", "/reset_prefix_cache", params=params)
            if resp.json().get("success", True):
                return
            await asyncio.sleep(0.05 * (i + 1))
        raise InferenceError("prefix cache reset refused (blocks still held)", server=self._base_url)

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        """Reload, then name ``version`` on the engine (which tags later tokens with it)."""
        await self._send(
            "POST",
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": weights_path}},
        )
        await self._send("POST", "/update_weight_version", json={"new_version": version_label(version)})
        self._version = version

    # vLLM's native weight-sync routes (a backend set by --weight-transfer-config moves the
    # data; rollbank's CPU one is rollbank.inference.publishing.vllm_plugin).
    async def init_weight_transfer_engine(self, init_info: Mapping[str, Any]) -> None:
        await self._send("POST", "/init_weight_transfer_engine", json={"init_info": dict(init_info)})

    async def start_weight_update(self) -> None:
        await self._send("POST", "/start_weight_update")

    async def update_weights(self, update_info: Mapping[str, Any]) -> None:
        await self._send("POST", "/update_weights", json={"update_info": dict(update_info)})

    async def finish_weight_update(self, *, version: int | None) -> None:
        """Finalize the update; ``version`` (if given) is named on the engine."""
        body = {"weight_version": None if version is None else version_label(version)}
        await self._send("POST", "/finish_weight_update", json=body)
        if version is not None:
            self._version = version

    async def set_weight_version(self, version: int) -> None:
        """Name ``version`` on the engine without touching the weights."""
        await self._send("POST", "/update_weight_version", json={"new_version": version_label(version)})
        self._version = version

    async def load_lora(self, name: str, path: str) -> None:
        await self._send("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})

    async def unload_lora(self, name: str) -> None:
        await self._send("POST", "/v1/unload_lora_adapter", json={"lora_name": name})

    async def metrics(self) -> ServerMetrics:
        resp = await self._send("GET", "/metrics")
        m = parse_prometheus(resp.text)

        def get(name: str) -> float:
            return m.get(f"vllm:{name}_total", m.get(f"vllm:{name}", 0.0))

        return ServerMetrics(
            running=int(m.get("vllm:num_requests_running", 0.0)),
            waiting=int(m.get("vllm:num_requests_waiting", 0.0)),
            prefix_cache_queries=get("prefix_cache_queries"),
            prefix_cache_hits=get("prefix_cache_hits"),
            prompt_tokens=get("prompt_tokens"),
            generation_tokens=get("generation_tokens"),
        )
