"""Async client for SGLang's native endpoints. UNTESTED AGAINST A REAL SGLANG SERVER.

SGLang does not install on this CPU-only machine (CUDA-only dependencies), so this client is
checked only against a recorded contract: ``tests/fixtures/sglang/contract.json``, request
and response bodies written by hand from SGLang's documentation and its ``http_server.py``
(the native API of SGLang ~0.5). Treat it as a starting point to verify on a GPU host.

Owns :class:`SGLangClient` (an :class:`~rollbank.inference.protocol.InferenceClient`).
Transport, retries and error typing are inherited from
:class:`~rollbank.inference.vllm_client.VLLMClient`; the endpoints differ:

- generate: ``POST /generate`` with ``input_ids``, ``sampling_params`` (``max_new_tokens``,
  ...), ``rid``, ``return_logprob`` (``logprob_start_len=-1``: output tokens only) and
  ``lora_path`` = adapter name. Tokens come from ``output_ids``, log-probs from
  ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples), the finish
  reason from ``meta_info.finish_reason.type``, the cache hit from ``meta_info.cached_tokens``
  and the total from ``meta_info.e2e_latency``. SGLang reports no queue/prefill split here.
  Which distribution the log-probs come from (before/after temperature) depends on the
  SGLang version and flags; this is not verified.
- abort: ``POST /abort_request {"rid"}``; pause: ``POST /pause_generation {"mode"}`` with
  ``abort`` -> ``abort`` and ``keep`` -> ``in_place``; SGLang has no drain-then-pause mode,
  so ``wait`` raises :class:`BadRequestError` (its weight update already waits for in-flight
  requests under a writer lock). ``POST /continue_generation``; ``POST /flush_cache`` (HTTP
  400 while requests run: retried briefly); ``POST /update_weights_from_disk``
  ``{"model_path", "weight_version"}``; ``POST /load_lora_adapter`` / ``/unload_lora_adapter``;
  metrics from ``/metrics`` (``--enable-metrics``; names ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``,
  ``sglang:cached_tokens_total``).
- ``is_paused`` is tracked by the client (SGLang has no query endpoint).
- Versions: SGLang reports one ``meta_info.weight_version`` label per request (its weight
  update takes a writer lock, so in-flight requests finish first); every token of the result
  gets it (mapped as in :mod:`rollbank.inference.engine_output`). Without the label the
  client's own version (set by :meth:`reload_weights`) is used. Log-probs are checked like
  vLLM's: a missing or non-finite one is an :class:`InvalidLogprobError`.
- Admission: inherited from :class:`VLLMClient` (waits on the gate before sending).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rollbank.errors import BadRequestError, InferenceError
from rollbank.inference.engine_output import checked_logprobs, parse_version_label, version_label
from rollbank.inference.protocol import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    ServerMetrics,
    Timings,
)
from rollbank.inference.vllm_client import VLLMClient, parse_prometheus

_PAUSE = {"abort": "abort", "keep": "in_place"}
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class SGLangClient(VLLMClient):
    """One SGLang server (native API). See the module docstring for what is verified."""

    _paused = False

    def generate_body(self, req: GenerateRequest) -> dict[str, Any]:
        sp = req.sampling
        sampling: dict[str, Any] = {
            "max_new_tokens": sp.max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "skip_special_tokens": False,
        }
        if sp.stop:
            sampling["stop"] = list(sp.stop)
        if sp.stop_token_ids:
            sampling["stop_token_ids"] = list(sp.stop_token_ids)
        if sp.min_tokens:
            sampling["min_new_tokens"] = sp.min_tokens
        body: dict[str, Any] = {
            "input_ids": list(req.prompt_token_ids),
            "sampling_params": sampling,
            "rid": req.request_id,
            "return_logprob": sp.logprobs,
            "logprob_start_len": -1,
            "stream": False,
        }
        if req.lora is not None:
            body["lora_path"] = req.lora
        return body

    async def connect(self) -> None:
        """Nothing to detect: SGLang's native ``/generate`` is the only generate path."""
        self._scale_out = False
        self._connected = True

    async def _generate(self, request: GenerateRequest, t0: float) -> GenerateResult:
        rid = request.request_id
        resp = await self._send("POST", "/generate", json=self.generate_body(request), request_id=rid)
        return self._parsed("/generate", rid, lambda: self._parse_generate(request, resp.json(), time.monotonic() - t0))

    def _parse_generate(self, request: GenerateRequest, data: dict[str, Any], total_s: float) -> GenerateResult:
        rid = request.request_id
        meta = data["meta_info"]
        token_ids = [int(t) for t in data["output_ids"]]
        logprobs: list[float] = []
        if request.sampling.logprobs:
            triples = meta.get("output_token_logprobs")
            if triples is None:
                triples = [[None, t, None] for t in token_ids]
            logprobs = checked_logprobs([t[0] for t in triples], server=self.base_url, request_id=rid)
            if [int(t[1]) for t in triples] != token_ids:
                raise ValueError("output_token_logprobs do not match output_ids")
        reason = (meta.get("finish_reason") or {}).get("type")
        finish = _FINISH.get(str(reason))
        if finish is None:
            raise ValueError(f"unexpected finish_reason {reason!r}")
        label = meta.get("weight_version")
        version = self._version if label is None else parse_version_label(label, server=self.base_url, request_id=rid)
        cached = meta.get("cached_tokens")
        return GenerateResult(
            request_id=rid,
            server=self.base_url,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            text=str(data.get("text") or ""),
            prompt_tokens=int(meta.get("prompt_tokens", len(request.prompt_token_ids))),
            policy_version=version,
            timings=Timings(total_s=float(meta.get("e2e_latency", total_s))),
            cached_prompt_tokens=int(cached) if cached is not None else None,
            token_versions=[version] * len(token_ids),
        )

    async def abort(self, request_id: str, *more: str) -> None:
        for rid in (request_id, *more):  # one request id per call
            await self._send("POST", "/abort_request", json={"rid": rid}, request_id=rid)

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        if mode not in _PAUSE:
            raise BadRequestError(
                f"SGLang has no pause mode {mode!r} (drain); use 'abort' or 'keep'", server=self.base_url
            )
        await self._send("POST", "/pause_generation", json={"mode": _PAUSE[mode]})
        self._paused = True
        if clear_cache and mode == "abort":
            await self.reset_prefix_cache()

    async def resume(self) -> None:
        await self._send("POST", "/continue_generation", json={})
        self._paused = False

    async def is_paused(self) -> bool:
        return self._paused

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None:
        # SGLang's /flush_cache has no preemption mode: ``reset_running_requests`` is ignored
        # and the flush is retried until running requests are gone.
        for i in range(attempts):
            try:
                await self._send("POST", "/flush_cache")
                return
            except BadRequestError:  # 400 while requests are running
                await asyncio.sleep(0.05 * (i + 1))
        raise InferenceError("flush_cache refused (requests still running)", server=self.base_url)

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        resp = await self._send(
            "POST",
            "/update_weights_from_disk",
            json={"model_path": weights_path, "weight_version": version_label(version)},
        )
        if not resp.json().get("success", False):
            raise InferenceError(f"weight update failed: {resp.text[:300]}", server=self.base_url)
        self._version = version

    async def load_lora(self, name: str, path: str) -> None:
        await self._send("POST", "/load_lora_adapter", json={"lora_name": name, "lora_path": path})

    async def unload_lora(self, name: str) -> None:
        await self._send("POST", "/unload_lora_adapter", json={"lora_name": name})

    async def metrics(self) -> ServerMetrics:
        m = parse_prometheus((await self._send("GET", "/metrics")).text)
        prompt = m.get("sglang:prompt_tokens_total", 0.0)
        return ServerMetrics(
            running=int(m.get("sglang:num_running_reqs", 0.0)),
            waiting=int(m.get("sglang:num_queue_reqs", 0.0)),
            prefix_cache_queries=prompt,
            prefix_cache_hits=m.get("sglang:cached_tokens_total", 0.0),
            prompt_tokens=prompt,
            generation_tokens=m.get("sglang:generation_tokens_total", 0.0),
        )
