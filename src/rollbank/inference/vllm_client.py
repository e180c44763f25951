"""Async client for one vLLM OpenAI-compatible server (checked against vLLM 0.32 CPU).

Owns :class:`VLLMClient`, the real :class:`~rollbank.inference.protocol.InferenceClient`.

Wire contract (endpoints as vLLM 0.32 registers them; the control routes need
``VLLM_SERVER_DEV_MODE=1``, which :mod:`rollbank.inference.server` sets):

- generate: ``POST /v1/completions`` with ``prompt`` = token ids, ``return_token_ids``,
  ``logprobs=1`` (the sampled token's log-prob; the server runs with
  ``--logprobs-mode processed_logprobs`` so it is the distribution actually sampled from) and
  header ``X-Request-Id`` = our request id (vLLM names it ``cmpl-<id>-0`` internally).
  Timings come from the response's ``metrics`` (``--enable-per-request-metrics``) and the
  cache hit from ``usage.prompt_tokens_details.cached_tokens``
  (``--enable-prompt-tokens-details``); both are ``None`` when the server does not send them.
  No per-request ``seed`` is ever sent: it kills the vLLM CPU 0.32 engine.
- abort: ``POST /abort_requests {"request_ids": ["cmpl-<id>-0"]}``; the aborted generation
  returns with ``finish_reason="abort"`` and its partial tokens. Cancelling :meth:`generate`
  closes the connection, which also aborts server side.
- pause/resume: ``POST /pause?mode=&clear_cache=``, ``POST /resume``, ``GET /is_paused``;
  ``POST /reset_prefix_cache``; weights: ``POST /collective_rpc`` with
  ``{"method": "reload_weights", "kwargs": {"weights_path": ...}}``; LoRA:
  ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``; ``GET /health``;
  ``GET /metrics`` (Prometheus text).

Errors and retries: a connect failure (nothing was sent) is retried ``connect_retries``
times, then :class:`ServerUnreachableError`. Anything after the request left is never
re-sent: a dropped connection is :class:`ServerUnreachableError`, a read timeout
:class:`InferenceTimeoutError`, 429/503 :class:`ServerOverloadedError`, 400/404/422
:class:`BadRequestError`, a 500 from a dead engine :class:`EngineDeadError`.

``policy_version`` is tracked by the client: :meth:`reload_weights` sets it after the
server confirmed the reload. A result is tagged with the version held when the request was
sent (with pause modes ``abort``/``wait`` no token of it can come from later weights).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any

import httpx

from rollbank.errors import (
    BadRequestError,
    EngineDeadError,
    InferenceError,
    InferenceTimeoutError,
    ServerOverloadedError,
    ServerUnreachableError,
)
from rollbank.inference.protocol import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    ServerMetrics,
    Timings,
)

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
_DEAD_MARKERS = ("enginecore", "engine core", "enginedead", "engine dead", "engine is dead")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum every sample of each metric name over its label sets (``name -> total``)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ")
        if "{" in line:
            name_part = line[: line.index("{")]
            rest = line[line.rindex("}") + 1 :]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        out[name_part] = out.get(name_part, 0.0) + value
    return out


def _ms(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    if not metrics or metrics.get(key) is None:
        return None
    return float(metrics[key]) / 1000.0


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
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.model = model
        self.connect_retries = connect_retries
        self._version = policy_version
        self._inflight: set[str] = set()
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
    def inflight(self) -> int:
        """Requests this client has sent and not yet seen answered."""
        return len(self._inflight)

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
    def completion_body(self, req: GenerateRequest) -> dict[str, Any]:
        sp = req.sampling
        body: dict[str, Any] = {
            "prompt": list(req.prompt_token_ids),
            "max_tokens": sp.max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.stop_token_ids:
            body["stop_token_ids"] = list(sp.stop_token_ids)
        if sp.logprobs:
            body["logprobs"] = 1
        if sp.min_tokens:
            body["min_tokens"] = sp.min_tokens
        model = req.lora or self.model
        if model is not None:
            body["model"] = model
        return body

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Send one generation; engine-specific parts are the ``_generate_*`` hooks."""
        rid = request.request_id
        version = self._version
        t0 = time.monotonic()
        self._inflight.add(rid)
        try:
            resp = await self._send(
                "POST",
                self.GENERATE_PATH,
                json=self._generate_body(request),
                headers=self._generate_headers(rid),
                request_id=rid,
            )
        finally:
            self._inflight.discard(rid)
        total = time.monotonic() - t0
        try:
            return self._generate_parse(request, resp.json(), version, total)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise InferenceError(
                f"malformed {self.GENERATE_PATH} response: {exc!r}",
                server=self._base_url,
                request_id=rid,
            ) from exc

    # Hooks a client for another engine's native endpoint overrides (see sglang_client).
    GENERATE_PATH = "/v1/completions"

    def _generate_body(self, request: GenerateRequest) -> dict[str, Any]:
        return self.completion_body(request)

    def _generate_headers(self, request_id: str) -> dict[str, str] | None:
        return {"X-Request-Id": request_id}

    def _generate_parse(
        self, request: GenerateRequest, data: dict[str, Any], version: int, total_s: float
    ) -> GenerateResult:
        return self._parse_completion(request, data, version, total_s)

    def _parse_completion(
        self, request: GenerateRequest, data: dict[str, Any], version: int, total_s: float
    ) -> GenerateResult:
        choice = data["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs: list[float] = []
        if request.sampling.logprobs:
            raw = (choice.get("logprobs") or {}).get("token_logprobs") or []
            logprobs = [float(x) if x is not None else -math.inf for x in raw]
            if len(logprobs) != len(token_ids):
                raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids)} tokens")
        reason = choice.get("finish_reason")
        finish = _FINISH.get(str(reason))
        if finish is None:
            raise ValueError(f"unexpected finish_reason {reason!r}")
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        metrics = data.get("metrics")
        queue_s = _ms(metrics, "queue_time_ms")
        prefill_s = _ms(metrics, "time_to_first_token_ms")
        first = queue_s + prefill_s if queue_s is not None and prefill_s is not None else None
        return GenerateResult(
            request_id=request.request_id,
            server=self._base_url,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            text=str(choice.get("text") or ""),
            prompt_tokens=int(usage.get("prompt_tokens", len(request.prompt_token_ids))),
            policy_version=version,
            timings=Timings(
                total_s=total_s,
                queue_s=queue_s,
                prefill_s=prefill_s,
                decode_s=_ms(metrics, "generation_time_ms"),
                first_token_s=first,
            ),
            cached_prompt_tokens=int(cached) if cached is not None else None,
        )

    async def abort(self, request_id: str) -> None:
        await self._send(
            "POST", "/abort_requests", json={"request_ids": [f"cmpl-{request_id}-0"]}, request_id=request_id
        )

    # ------------------------------------------------------------------ control plane
    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        params = {"mode": mode, "clear_cache": "true" if clear_cache else "false"}
        await self._send("POST", "/pause", params=params)

    async def resume(self) -> None:
        await self._send("POST", "/resume")

    async def is_paused(self) -> bool:
        resp = await self._send("GET", "/is_paused")
        return bool(resp.json()["is_paused"])

    async def reset_prefix_cache(self, *, attempts: int = 20) -> None:
        """Reset; vLLM refuses while blocks are held (running requests), so retry briefly."""
        for i in range(attempts):
            resp = await self._send("POST", "/reset_prefix_cache")
            if resp.json().get("success", True):
                return
            await asyncio.sleep(0.05 * (i + 1))
        raise InferenceError("prefix cache reset refused (blocks still held)", server=self._base_url)

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        await self._send(
            "POST",
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": weights_path}},
        )
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
