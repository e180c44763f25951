"""vLLM 0.32 wire shapes: request bodies and response parsers (pure; no I/O).

Owns the two generate shapes :class:`~rollbank.inference.vllm_client.VLLMClient` speaks and
the Prometheus scrape of ``/metrics``:

- scale-out (``--enable-scale-out``): ``POST /inference/v1/generate`` with
  ``{"model", "token_ids", "request_id", "output_mode": "text", "sampling_params": {...}}``;
  per choice ``token_ids``, ``text``, ``logprobs.content[i].logprob``, ``finish_reason`` and
  ``weight_versions`` = ``[{"version", "start", "end"}]`` spans over the output tokens. The
  engine says which weights produced which token; that is the only version source here.
- completions (fallback for servers without scale-out): ``POST /v1/completions`` with
  ``prompt`` = token ids, ``return_token_ids``, ``logprobs=1``; per choice ``token_ids``,
  ``logprobs.token_logprobs``, ``finish_reason``; timings from ``metrics``
  (``--enable-per-request-metrics``). It carries no versions: the client brackets the request
  with ``/weight_info`` reads and passes the (single) version in.

Every log-prob goes through :func:`~rollbank.inference.engine_output.checked_logprobs` and every
version through :mod:`~rollbank.inference.engine_output`; shape errors raise ``KeyError`` /
``ValueError`` / ``TypeError`` which the client turns into a typed malformed-response error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rollbank.inference.engine_output import checked_logprobs, versions_from_spans
from rollbank.inference.protocol import (
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    Timings,
)

FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
SCALE_OUT_GENERATE = "/inference/v1/generate"
SCALE_OUT_ABORT = "/inference/v1/abort_requests"
COMPLETIONS = "/v1/completions"


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum every sample of each sample name over its label sets (``name -> total``)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def ms(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    if not metrics or metrics.get(key) is None:
        return None
    value = float(metrics[key]) / 1000.0
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"metrics.{key} is {metrics[key]!r}, not a duration")
    return value


def _count(value: object, what: str) -> int:
    """A non-negative JSON integer (a token id or a token count); anything else is refused
    rather than coerced (``int(1.7)`` would silently become another token)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} is not a non-negative integer")
    return value


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    """``value`` as a JSON object; None (absent) is an empty one."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} is {type(value).__name__}, expected an object")
    return value


def _choice(data: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(data, "the response")["choices"][0], "choices[0]")


def _token_ids(choice: Mapping[str, Any]) -> list[int]:
    raw = choice["token_ids"]
    if raw is not None and not isinstance(raw, list):
        raise TypeError(f"token_ids is {type(raw).__name__}, expected a list")
    return [_count(t, "token id") for t in raw or []]


def _finish(reason: object) -> FinishReason:
    finish = FINISH.get(str(reason))
    if finish is None:
        raise ValueError(f"unexpected finish_reason {reason!r}")
    return finish


def _sampling(sp: SamplingParams, *, logprobs: int) -> dict[str, Any]:
    """The sampling options both request shapes share (``logprobs``: the value that asks for
    the sampled token's log-prob, which differs between the two endpoints)."""
    out: dict[str, Any] = {
        "max_tokens": sp.max_tokens,
        "temperature": sp.temperature,
        "top_p": sp.top_p,
        "skip_special_tokens": False,
    }
    if sp.stop:
        out["stop"] = list(sp.stop)
    if sp.stop_token_ids:
        out["stop_token_ids"] = list(sp.stop_token_ids)
    if sp.logprobs:
        out["logprobs"] = logprobs
    if sp.min_tokens:
        out["min_tokens"] = sp.min_tokens
    return out


def completion_body(req: GenerateRequest, model: str | None, *, cache_salt: str | None = None
                    ) -> dict[str, Any]:
    """``cache_salt``: vLLM's per-request prefix-cache salt (blocks are shared only between
    requests with the same salt); rollbank salts by weight version (:func:`version_salt`)."""
    body: dict[str, Any] = {"prompt": list(req.prompt_token_ids), "return_token_ids": True,
                            **_sampling(req.sampling, logprobs=1)}
    if req.lora or model:
        body["model"] = req.lora or model
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def version_salt(version: int) -> str:
    """The prefix-cache salt of weight ``version``: a new version never reuses KV blocks
    computed (and hashed) under another version's salt, with or without a cache reset."""
    return f"rollbank-weights-v{version}"


def scale_out_body(req: GenerateRequest, model: str | None, *, cache_salt: str | None = None
                   ) -> dict[str, Any]:
    # logprobs 0: the sampled token's log-prob only
    sampling = {**_sampling(req.sampling, logprobs=0), "detokenize": True}
    body: dict[str, Any] = {
        "token_ids": list(req.prompt_token_ids),
        "request_id": req.request_id,
        "output_mode": "text",
        "sampling_params": sampling,
    }
    if req.lora or model:
        body["model"] = req.lora or model
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def _usage(data: Mapping[str, Any], request: GenerateRequest) -> tuple[int, int | None]:
    usage = _mapping(data.get("usage"), "usage")
    cached = _mapping(usage.get("prompt_tokens_details"), "usage.prompt_tokens_details").get("cached_tokens")
    prompt = _count(usage.get("prompt_tokens", len(request.prompt_token_ids)), "usage.prompt_tokens")
    return prompt, (_count(cached, "usage.cached_tokens") if cached is not None else None)


def _timings(data: Mapping[str, Any], total_s: float) -> Timings:
    metrics = _mapping(data.get("metrics"), "metrics")
    queue_s = ms(metrics, "queue_time_ms")
    prefill_s = ms(metrics, "time_to_first_token_ms")
    first = queue_s + prefill_s if queue_s is not None and prefill_s is not None else None
    return Timings(total_s=total_s, queue_s=queue_s, prefill_s=prefill_s,
                   decode_s=ms(metrics, "generation_time_ms"), first_token_s=first)


def parse_completion(
    request: GenerateRequest, data: Mapping[str, Any], *, server: str, version: int, total_s: float
) -> GenerateResult:
    """A ``/v1/completions`` answer; every token gets ``version`` (read from the engine)."""
    rid = request.request_id
    choice = _choice(data)
    token_ids = _token_ids(choice)
    logprobs: list[float] = []
    if request.sampling.logprobs:
        raw = _mapping(choice.get("logprobs"), "logprobs").get("token_logprobs")
        if raw is None and token_ids:
            raw = [None] * len(token_ids)  # a missing list is a missing log-prob at position 0
        if raw is not None and not isinstance(raw, list):
            raise TypeError(f"logprobs.token_logprobs is {type(raw).__name__}, expected a list")
        logprobs = checked_logprobs(list(raw or []), server=server, request_id=rid)
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids)} tokens")
    prompt_tokens, cached = _usage(data, request)
    return GenerateResult(
        request_id=rid, server=server, token_ids=token_ids, logprobs=logprobs,
        finish_reason=_finish(choice.get("finish_reason")), text=str(choice.get("text") or ""),
        prompt_tokens=prompt_tokens, policy_version=version, timings=_timings(data, total_s),
        cached_prompt_tokens=cached, token_versions=[version] * len(token_ids),
    )


def parse_scale_out(
    request: GenerateRequest, data: Mapping[str, Any], *, server: str, current_version: int, total_s: float
) -> GenerateResult:
    """An ``/inference/v1/generate`` answer; versions come from its ``weight_versions`` spans.

    ``current_version`` is used only as ``policy_version`` of an empty output.
    """
    rid = request.request_id
    choice = _choice(data)
    token_ids = _token_ids(choice)
    logprobs: list[float] = []
    if request.sampling.logprobs:
        content = _mapping(choice.get("logprobs"), "logprobs").get("content")
        if content is None:
            content = [{}] * len(token_ids)
        if not isinstance(content, list):
            raise TypeError(f"logprobs.content is {type(content).__name__}, expected a list")
        logprobs = checked_logprobs([_mapping(c, "logprobs.content[i]").get("logprob") for c in content],
                                    server=server, request_id=rid)
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids)} tokens")
    versions = versions_from_spans(choice.get("weight_versions"), len(token_ids), server=server, request_id=rid)
    prompt_tokens, cached = _usage(data, request)
    return GenerateResult(
        request_id=rid, server=server, token_ids=token_ids, logprobs=logprobs,
        finish_reason=_finish(choice.get("finish_reason")), text=str(choice.get("text") or ""),
        prompt_tokens=prompt_tokens, policy_version=versions[-1] if versions else current_version,
        timings=_timings(data, total_s), cached_prompt_tokens=cached, token_versions=versions,
    )


def prompt_logprobs_body(token_ids: list[int], model: str | None) -> dict[str, Any]:
    """Score ``token_ids`` (prefill only): ``prompt_logprobs=0`` asks for each prompt token's
    own log-prob; one throw-away token is generated (vLLM needs ``max_tokens >= 1``)."""
    body: dict[str, Any] = {"prompt": list(token_ids), "max_tokens": 1, "temperature": 1.0,
                            "prompt_logprobs": 0, "return_token_ids": True}
    if model:
        body["model"] = model
    return body


def parse_prompt_logprobs(
    token_ids: list[int], data: Mapping[str, Any], *, server: str, request_id: str
) -> list[float]:
    """``out[t] = log p(token_ids[t] | token_ids[:t])`` from ``choices[0].prompt_logprobs``
    (a list of ``None`` then ``{"<token id>": {"logprob": ...}}``); ``out[0] = 0.0``."""
    entries = data["choices"][0]["prompt_logprobs"]
    if len(entries) != len(token_ids):
        raise ValueError(f"{len(entries)} prompt log-probs for {len(token_ids)} tokens")
    values: list[object] = []
    for t, (tok, entry) in enumerate(zip(token_ids, entries, strict=True)):
        if t == 0:
            continue
        values.append((entry or {}).get(str(tok), {}).get("logprob"))
    return [0.0, *checked_logprobs(values, server=server, request_id=request_id)] if token_ids else []
