"""Async client for one vLLM server (checked against vLLM 0.32 CPU).

Owns :class:`VLLMClient`, the real :class:`~rollbank.inference.protocol.InferenceClient`.
Wire shapes (bodies, parsers) live in :mod:`rollbank.inference.vllm_wire`.

Wire contract (endpoints as vLLM 0.32 registers them; the control routes need
``VLLM_SERVER_DEV_MODE=1``, which :mod:`rollbank.inference.server` sets):

- generate, preferred: ``POST /inference/v1/generate`` (servers started with
  ``--enable-scale-out``, as managed servers are). The engine returns ``weight_versions``
  spans over the output tokens: the per-token versions of every result come from there.
- generate, fallback (a server without scale-out): ``POST /v1/completions`` with token ids,
  bracketed by two ``GET /weight_info`` reads; if the engine's version changed in between,
  no token can be attributed and the request fails with :class:`WeightVersionError`.
  ``scale_out=None`` (default) detects which one the server has (``/openapi.json``) on
  :meth:`connect` or the first generate; :meth:`connect` also refuses a server that reports
  no usable version (:class:`WeightVersionError`), so a run against an external server fails
  before the first episode rather than tagging tokens with a guess.
- Version labels: rollbank names version ``v`` on the engine as ``str(v)``; ``"default"``
  (never set) is 0 (:mod:`rollbank.inference.engine_output`).
- Admission: :meth:`generate` waits on the client's :class:`AdmissionGate` before sending;
  a :class:`~rollbank.inference.publish.WeightPublisher` installs its gate on its clients.
- abort: ``POST /inference/v1/abort_requests {"request_ids": ["generate-tokens-<id>"]}``
  (scale-out) or ``POST /abort_requests {"request_ids": ["cmpl-<id>-0"]}``; the aborted
  generation returns with ``finish_reason="abort"`` and its partial tokens
  (several ids in one call: ``abort(*inflight_ids)``). Cancelling
  :meth:`generate` closes the connection, which also aborts server side.
- pause/resume: ``POST /pause?mode=&clear_cache=``, ``POST /resume``, ``GET /is_paused``;
  ``POST /reset_prefix_cache``; weights: ``POST /collective_rpc`` with
  ``{"method": "reload_weights", "kwargs": {"weights_path": ...}}`` then
  ``POST /update_weight_version {"new_version": str(version)}``; ``GET /weight_info``; LoRA:
  ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``; ``GET /health``;
  ``GET /metrics`` (Prometheus text, parsed by ``prometheus_client``).
  No per-request ``seed`` is ever sent: it kills the vLLM CPU 0.32 engine.

Errors and retries: a connect failure (nothing was sent) is retried ``connect_retries``
times, then :class:`ServerUnreachableError`. Anything after the request left is never
re-sent: a dropped connection is :class:`ServerUnreachableError`, a read timeout
:class:`InferenceTimeoutError`, 429/503 :class:`ServerOverloadedError`, 400/404/422
:class:`BadRequestError`, a 500 from a dead engine :class:`EngineDeadError`; a missing or
non-finite log-prob :class:`InvalidLogprobError` (request id and token position recorded).

``policy_version`` is the version the engine was last known to hold (set by
:meth:`reload_weights` after the engine accepted the new label, or read by :meth:`connect`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from rollbank.errors import (
    BadRequestError,
    EngineDeadError,
    InferenceError,
    InferenceTimeoutError,
    ServerOverloadedError,
    ServerUnreachableError,
    WeightVersionError,
)
from rollbank.inference import vllm_wire as wire
from rollbank.inference.engine_output import parse_version_label, version_label
from rollbank.inference.protocol import (
    AdmissionGate,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    ServerMetrics,
)
from rollbank.inference.vllm_wire import parse_prometheus

__all__ = ["KEEPALIVE_EXPIRY_S", "VLLMClient", "parse_prometheus"]

_DEAD_MARKERS = ("enginecore", "engine core", "enginedead", "engine dead", "engine is dead")


KEEPALIVE_EXPIRY_S = 2.0


class VLLMClient:
    """One vLLM server. ``transport`` is the test seam (``httpx.MockTransport``)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        connect_retries: int = 2,
        policy_version: int = 0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 256,
        scale_out: bool | None = None,
        admission: AdmissionGate | None = None,
        versions_from_engine: bool = True,
        salt_by_version: bool = False,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.model = model
        # True: every generation carries cache_salt = version_salt(the version this client last
        # installed or read); a publication may then skip the prefix-cache reset
        self.salt_by_version = salt_by_version
        self.connect_retries = connect_retries
        self._version = policy_version
        self._inflight: set[str] = set()
        self._scale_out = scale_out  # None: detect on connect()
        self._connected = False
        self._connect_lock = asyncio.Lock()
        self._admission = admission or AdmissionGate()
        # closed by the server's supervisor while a restarted engine re-loads the served version
        self.hold = AdmissionGate()
        # False only behind a third-party router (routing benchmarks): no /weight_info there,
        # completions results carry the client's own version. Never for collection.
        self._versions_from_engine = versions_from_engine
        self._http = httpx.AsyncClient(
            base_url=self._base_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=transport,
            # vLLM's server closes idle keep-alive connections after 5 s
            # (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); reusing one it is closing fails with "Server
            # disconnected" after any tool pause of ~5 s. Expire ours first.
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=64,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
        )

    # ------------------------------------------------------------------ basics
    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def admission(self) -> AdmissionGate:
        return self._admission

    def set_admission(self, gate: AdmissionGate) -> None:
        self._admission = gate

    @property
    def scale_out(self) -> bool | None:
        """Whether generations use ``/inference/v1/generate``; None until detected."""
        return self._scale_out

    @property
    def inflight(self) -> int:
        """Requests this client has sent and not yet seen answered."""
        return len(self._inflight)

    @property
    def inflight_ids(self) -> tuple[str, ...]:
        return tuple(self._inflight)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """One HTTP call with typed errors; retries only connect failures (nothing sent)."""
        kwargs: dict[str, Any] = {"json": json, "params": params, "headers": headers}
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        attempt = 0
        while True:
            try:
                resp = await self._http.request(method, path, **kwargs)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt < self.connect_retries:
                    attempt += 1
                    await asyncio.sleep(0.1 * 2**attempt)
                    continue
                raise ServerUnreachableError(
                    f"{method} {path}: cannot connect: {exc}", server=self._base_url, request_id=request_id
                ) from exc
            except httpx.TimeoutException as exc:
                raise InferenceTimeoutError(
                    f"{method} {path}: timed out ({type(exc).__name__})",
                    server=self._base_url,
                    request_id=request_id,
                ) from exc
            except httpx.TransportError as exc:
                raise ServerUnreachableError(
                    f"{method} {path}: connection lost: {exc!r}", server=self._base_url, request_id=request_id
                ) from exc
        if resp.status_code >= 400:
            await self._raise_for_status(resp, f"{method} {path}", request_id)
        return resp

    async def _raise_for_status(self, resp: httpx.Response, what: str, request_id: str | None) -> None:
        code = resp.status_code
        body = resp.text[:500]
        msg = f"{what}: HTTP {code}: {body}"
        kw: dict[str, Any] = {"server": self._base_url, "request_id": request_id}
        if code in (400, 404, 422):
            raise BadRequestError(msg, **kw)
        if any(m in body.lower() for m in _DEAD_MARKERS) or (code >= 500 and not await self.health()):
            raise EngineDeadError(msg, **kw)
        if code in (429, 503):
            raise ServerOverloadedError(msg, **kw)
        raise InferenceError(msg, **kw)

    # ------------------------------------------------------------------ generation
    async def connect(self) -> None:
        """Detect the generate endpoint and read the engine's version (once).

        Raises :class:`WeightVersionError` when the server cannot say which version it
        serves (no ``/weight_info``, or a label rollbank did not publish).
        """
        async with self._connect_lock:
            if self._connected:
                return
            if self._scale_out is None:
                try:
                    paths = (await self._send("GET", "/openapi.json")).json().get("paths") or {}
                except (BadRequestError, ValueError, AttributeError):
                    paths = {}  # no schema published (e.g. docs disabled): completions
                self._scale_out = isinstance(paths, dict) and wire.SCALE_OUT_GENERATE in paths
            if self._versions_from_engine:
                self._version = await self.engine_version()
            self._connected = True

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

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Wait for admission, send one generation, return it with the engine's versions."""
        if not self._connected:
            await self.connect()
        while not (self.hold.is_open and self._admission.is_open):  # last thing before sending
            await self.hold.wait_open()
            await self._admission.wait_open()
        rid = request.request_id
        t0 = time.monotonic()
        self._inflight.add(rid)
        try:
            return await self._generate(request, t0)
        finally:
            self._inflight.discard(rid)

    def _salt(self) -> str | None:
        return wire.version_salt(self._version) if self.salt_by_version else None

    async def _generate(self, request: GenerateRequest, t0: float) -> GenerateResult:
        rid = request.request_id
        headers = {"X-Request-Id": rid}
        if self._scale_out:
            resp = await self._send("POST", wire.SCALE_OUT_GENERATE, headers=headers, request_id=rid,
                                    json=wire.scale_out_body(request, self.model, cache_salt=self._salt()))
            return self._parsed(wire.SCALE_OUT_GENERATE, rid, lambda: wire.parse_scale_out(
                request, resp.json(), server=self._base_url, current_version=self._version,
                total_s=time.monotonic() - t0))
        before = await self.engine_version(rid) if self._versions_from_engine else self._version
        resp = await self._send("POST", wire.COMPLETIONS, headers=headers, request_id=rid,
                                json=wire.completion_body(request, self.model, cache_salt=self._salt()))
        total = time.monotonic() - t0
        after = await self.engine_version(rid) if self._versions_from_engine else before
        if after != before:
            raise WeightVersionError(
                f"request {rid}: the engine's version changed from {before} to {after} during a "
                "/v1/completions request, which cannot say which tokens came from which; use a "
                "server started with --enable-scale-out", server=self._base_url, request_id=rid)
        return self._parsed(wire.COMPLETIONS, rid, lambda: wire.parse_completion(
            request, resp.json(), server=self._base_url, version=before, total_s=total))

    async def prompt_logprobs(self, token_ids: list[int], *, request_id: str) -> list[float]:
        """The engine's log-prob of every token of ``token_ids`` given its prefix (prefill,
        ``POST /v1/completions`` with ``prompt_logprobs=0``); ``out[0] = 0.0``. Used to score
        sequences with the engine's numerics (``rollbank numerics``)."""
        resp = await self._send("POST", wire.COMPLETIONS, headers={"X-Request-Id": request_id},
                                request_id=request_id,
                                json=wire.prompt_logprobs_body(token_ids, self.model))
        try:
            return wire.parse_prompt_logprobs(token_ids, resp.json(), server=self._base_url,
                                              request_id=request_id)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise InferenceError(f"malformed prompt log-probs: {exc!r}", server=self._base_url,
                                 request_id=request_id) from exc

    def _parsed(self, path: str, rid: str, parse: Callable[[], GenerateResult]) -> GenerateResult:
        """``parse()``, with shape errors as a typed malformed-response error."""
        try:
            return parse()
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise InferenceError(
                f"malformed {path} response: {exc!r}", server=self._base_url, request_id=rid
            ) from exc

    async def abort(self, request_id: str, *more: str) -> None:
        ids = (request_id, *more)
        if self._scale_out:
            path, engine_ids = wire.SCALE_OUT_ABORT, [f"generate-tokens-{r}" for r in ids]
        else:
            path, engine_ids = "/abort_requests", [f"cmpl-{r}-0" for r in ids]
        await self._send("POST", path, json={"request_ids": engine_ids}, request_id=request_id)

    # ------------------------------------------------------------------ control plane
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

    async def health(self) -> bool:
        try:
            resp = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

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
