"""vLLM 0.32 response shapes the accelsim benchmark engine answers with (pure).

Owns the JSON bodies of ``/inference/v1/generate`` (scale-out, ``weight_versions`` spans),
``/v1/completions`` and the Prometheus text of ``/metrics`` (vLLM's metric names, so
:meth:`rollbank.inference.vllm_client.VLLMClient.metrics` reads them unchanged).

One deliberate superset: the scale-out body carries the per-request ``metrics`` (queue, TTFT,
decode ms) that vLLM 0.32 only returns on ``/v1/completions``; the client reads them when
present, so accel-regime runs get TTFT per request without a second route.
"""

from __future__ import annotations

from typing import Any

from rollbank_bench.accelsim.core import Counters, SimRequest


def _spans(versions: list[str]) -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


def _usage(req: SimRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": len(req.prompt),
        "completion_tokens": len(req.output),
        "total_tokens": len(req.prompt) + len(req.output),
        "prompt_tokens_details": {"cached_tokens": req.cached},
    }


def _metrics(req: SimRequest) -> dict[str, Any]:
    """vLLM's per-request metrics (``--enable-per-request-metrics``), in ms."""
    out: dict[str, Any] = {"queue_time_ms": None, "time_to_first_token_ms": None,
                           "generation_time_ms": None, "mean_itl_ms": None}
    if req.scheduled_at is not None:
        out["queue_time_ms"] = (req.scheduled_at - req.arrival) * 1000
        if req.first_token_at is not None:
            out["time_to_first_token_ms"] = (req.first_token_at - req.scheduled_at) * 1000
            last = req.finished_at if req.finished_at is not None else req.first_token_at
            out["generation_time_ms"] = (last - req.first_token_at) * 1000
            if len(req.output) > 1:
                out["mean_itl_ms"] = out["generation_time_ms"] / (len(req.output) - 1)
    return out


def generate_body(req: SimRequest, request_id: str, model: str, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "token_ids": list(req.output),
        "text": "",
        "logprobs": None,
        "finish_reason": req.finish_reason,
        "weight_versions": _spans(req.versions),
    }
    if logprobs:
        choice["logprobs"] = {"content": [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(req.output, req.logprobs, strict=True)
        ]}
    return {"request_id": request_id, "model": model, "output_mode": "text", "choices": [choice],
            "usage": _usage(req), "metrics": _metrics(req)}


def completion_body(req: SimRequest, model: str, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0, "text": "", "token_ids": list(req.output), "logprobs": None,
        "finish_reason": req.finish_reason, "stop_reason": None,
    }
    if logprobs:
        choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in req.output],
                              "token_logprobs": list(req.logprobs), "text_offset": [0] * len(req.output),
                              "top_logprobs": None}
    return {"id": req.engine_id, "object": "text_completion", "model": model, "choices": [choice],
            "usage": _usage(req), "metrics": _metrics(req)}


def prometheus_text(c: Counters, *, running: int, waiting: int, model: str) -> str:
    labels = f'{{engine="0",model_name="{model}"}}'
    rows = [
        ("gauge", "vllm:num_requests_running", running),
        ("gauge", "vllm:num_requests_waiting", waiting),
        ("counter", "vllm:prefix_cache_queries_total", c.prefix_cache_queries),
        ("counter", "vllm:prefix_cache_hits_total", c.prefix_cache_hits),
        ("counter", "vllm:prompt_tokens_total", c.prompt_tokens),
        ("counter", "vllm:generation_tokens_total", c.generation_tokens),
        ("counter", "accelsim:steps_total", c.steps),
        ("counter", "accelsim:busy_seconds_total", c.busy_s),
    ]
    out: list[str] = []
    for kind, name, value in rows:
        family = name.removesuffix("_total")
        out += [f"# HELP {family} accelsim benchmark engine", f"# TYPE {family} {kind}",
                f"{name}{labels} {float(value)!r}"]
    return "\n".join(out) + "\n"
