"""Async client for one vLLM server (checked against vLLM 0.32 CPU).

Owns :class:`VLLMClient`, the real :class:`~rollbank.inference.protocol.InferenceClient`:
generation, abort and admission. Its bases: :mod:`rollbank.inference.vllm_http` (transport,
retries, typed errors) and :mod:`rollbank.inference.vllm_control` (version, pause/resume,
cache, weights, LoRA, metrics). Wire shapes (bodies, parsers) live in
:mod:`rollbank.inference.vllm_wire`.

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
  a publisher (:mod:`rollbank.inference.publishing`) installs its gate on its clients.
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
from collections.abc import Callable
from typing import Any

import httpx

from rollbank.errors import BadRequestError, InferenceError, WeightVersionError
from rollbank.inference import vllm_wire as wire
from rollbank.inference.protocol import AdmissionGate, GenerateRequest, GenerateResult
from rollbank.inference.vllm_control import VLLMControl
from rollbank.inference.vllm_http import KEEPALIVE_EXPIRY_S
from rollbank.inference.vllm_wire import parse_prometheus

__all__ = ["KEEPALIVE_EXPIRY_S", "VLLMClient", "parse_prometheus"]


class VLLMClient(VLLMControl):
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
        super().__init__(base_url, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                         connect_retries=connect_retries, transport=transport,
                         max_connections=max_connections)
        self.model = model
        # True: every generation carries cache_salt = version_salt(the version this client last
        # installed or read); a publication may then skip the prefix-cache reset
        self.salt_by_version = salt_by_version
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

    # ------------------------------------------------------------------ basics
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

    def generate_call(self, request: GenerateRequest) -> tuple[str, dict[str, Any]]:
        """The route and JSON body :meth:`generate` sends for ``request`` (once connected):
        what a caller of the engine's own HTTP API would send for the same generation."""
        if self._scale_out:
            return wire.SCALE_OUT_GENERATE, wire.scale_out_body(request, self.model, cache_salt=self._salt())
        return wire.COMPLETIONS, wire.completion_body(request, self.model, cache_salt=self._salt())

    async def _generate(self, request: GenerateRequest, t0: float) -> GenerateResult:
        rid = request.request_id
        headers = {"X-Request-Id": rid}
        path, body = self.generate_call(request)
        if self._scale_out:
            resp = await self._send("POST", path, headers=headers, request_id=rid, json=body)
            return self._parsed(path, rid, lambda: wire.parse_scale_out(
                request, resp.json(), server=self._base_url, current_version=self._version,
                total_s=time.monotonic() - t0))
        before = await self.engine_version(rid) if self._versions_from_engine else self._version
        resp = await self._send("POST", path, headers=headers, request_id=rid, json=body)
        total = time.monotonic() - t0
        after = await self.engine_version(rid) if self._versions_from_engine else before
        if after != before:
            raise WeightVersionError(
                f"request {rid}: the engine's version changed from {before} to {after} during a "
                "/v1/completions request, which cannot say which tokens came from which; use a "
                "server started with --enable-scale-out", server=self._base_url, request_id=rid)
        return self._parsed(path, rid, lambda: wire.parse_completion(
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
