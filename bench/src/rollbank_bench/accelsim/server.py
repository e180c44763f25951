"""HTTP front of the accelsim benchmark engine: vLLM 0.32's routes, as rollbank calls them.

Owns :func:`make_app` (an ``aiohttp`` application over one :class:`EngineDriver`). aiohttp is
already in the venv (vLLM depends on it) and is the lightest asyncio server here: the
emulator's own CPU per request is a JSON parse, one hash per token and one JSON dump.

Routes: ``POST /inference/v1/generate`` and ``/v1/completions`` (token-id prompts only; a text
prompt is a 400), ``POST /inference/v1/abort_requests`` and ``/abort_requests``, ``POST /pause``
``/resume``, ``GET /is_paused``, ``POST /reset_prefix_cache``, ``POST /collective_rpc``
(``reload_weights`` only), ``POST /update_weight_version``, ``GET /weight_info``,
``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, ``GET /v1/models``, ``/health``,
``/metrics`` and ``/openapi.json`` (lists the generate route, so the client picks scale-out).
A client that disconnects aborts its request, as vLLM does.
"""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from rollbank_bench.accelsim import wire
from rollbank_bench.accelsim.core import SimRequest
from rollbank_bench.accelsim.driver import EngineDriver

DRIVER: web.AppKey[EngineDriver] = web.AppKey("driver", EngineDriver)
ROUTES = (
    "/inference/v1/generate", "/v1/completions", "/inference/v1/abort_requests", "/abort_requests",
    "/pause", "/resume", "/is_paused", "/reset_prefix_cache", "/collective_rpc",
    "/update_weight_version", "/weight_info", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
    "/v1/models", "/health", "/metrics",
)


class _BadRequest(Exception):
    pass


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "BadRequestError", "code": status}},
                             status=status)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise _BadRequest(f"invalid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _BadRequest("body must be a JSON object")
    return body


def _build(d: EngineDriver, engine_id: str, prompt: Any, sp: dict[str, Any], model: Any) -> SimRequest:
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        raise _BadRequest("prompt must be a non-empty list of token ids (the engine has no tokenizer)")
    vocab = d.profile.vocab_size
    if any(t < 0 or t >= vocab for t in prompt):
        raise _BadRequest(f"token id out of vocabulary [0, {vocab})")
    lora: str | None = None
    if model not in (None, d.served_model):
        if model not in d.loras:
            raise _BadRequest(f"The model `{model}` does not exist.")
        lora = str(model)
    limit = d.profile.max_model_len
    max_tokens = sp.get("max_tokens")
    max_tokens = limit - len(prompt) if max_tokens is None else int(max_tokens)
    if max_tokens < 1 or len(prompt) + max_tokens > limit:
        raise _BadRequest(f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds max_model_len {limit}")
    temperature = float(sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0)
    if not math.isfinite(temperature) or temperature < 0:
        raise _BadRequest("temperature must be >= 0")
    return d.make_request(
        engine_id, prompt, max_tokens=max_tokens, min_tokens=int(sp.get("min_tokens") or 0),
        temperature=temperature, stop_ids=[int(t) for t in sp.get("stop_token_ids") or []],
        lora=lora, ignore_eos=bool(sp.get("ignore_eos", False)),
    )


async def generate(request: web.Request) -> web.Response:
    d = request.app[DRIVER]
    try:
        body = await _json(request)
        rid = str(body.get("request_id") or request.headers.get("X-Request-Id") or id(body))
        sp = body.get("sampling_params") or {}
        req = _build(d, f"generate-tokens-{rid}", body.get("token_ids"), sp, body.get("model"))
    except (_BadRequest, TypeError, ValueError) as exc:
        return _error(400, str(exc))
    done = await d.generate(req)
    return web.json_response(wire.generate_body(done, rid, d.served_model, sp.get("logprobs") is not None))


async def completions(request: web.Request) -> web.Response:
    d = request.app[DRIVER]
    try:
        body = await _json(request)
        if body.get("stream"):
            raise _BadRequest("streaming is not supported by the accelsim engine")
        rid = request.headers.get("X-Request-Id") or str(id(body))
        req = _build(d, f"cmpl-{rid}-0", body.get("prompt"), body, body.get("model"))
    except (_BadRequest, TypeError, ValueError) as exc:
        return _error(400, str(exc))
    done = await d.generate(req)
    return web.json_response(wire.completion_body(done, d.served_model, body.get("logprobs") is not None))


async def abort_requests(request: web.Request) -> web.Response:
    body = await _json(request)
    request.app[DRIVER].abort([str(r) for r in body.get("request_ids") or []])
    return web.json_response({})


async def pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    if mode not in ("abort", "wait", "keep"):
        return _error(400, f"unknown pause mode {mode!r}")
    await request.app[DRIVER].pause(mode, clear_cache=request.query.get("clear_cache", "true") == "true")
    return web.json_response({})


async def resume(request: web.Request) -> web.Response:
    request.app[DRIVER].resume()
    return web.json_response({})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": request.app[DRIVER].paused})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    request.app[DRIVER].core.reset_cache()
    return web.json_response({"success": True})


async def collective_rpc(request: web.Request) -> web.Response:
    body = await _json(request)
    if body.get("method") != "reload_weights":
        return _error(400, f"collective_rpc method {body.get('method')!r} is not emulated")
    path = (body.get("kwargs") or {}).get("weights_path")
    request.app[DRIVER].reload(str(path))
    return web.json_response({"results": [None]})


async def update_weight_version(request: web.Request) -> web.Response:
    body = await _json(request)
    request.app[DRIVER].set_version(str(body["new_version"]))
    return web.json_response({})


async def weight_info(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[DRIVER].core.weight_version})


async def load_lora(request: web.Request) -> web.Response:
    body = await _json(request)
    d = request.app[DRIVER]
    d.loras[str(body["lora_name"])] = str(body.get("lora_path", ""))
    return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")


async def unload_lora(request: web.Request) -> web.Response:
    body = await _json(request)
    if request.app[DRIVER].loras.pop(str(body["lora_name"]), None) is None:
        return _error(404, f"The lora adapter '{body['lora_name']}' cannot be found.")
    return web.Response(text="Success")


async def models(request: web.Request) -> web.Response:
    d = request.app[DRIVER]
    names = [d.served_model, *d.loras]
    return web.json_response({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=503 if request.app[DRIVER].dead is not None else 200)


async def metrics(request: web.Request) -> web.Response:
    d = request.app[DRIVER]
    c = d.core
    text = wire.prometheus_text(c.counters, running=len(c.running), waiting=len(c.waiting), model=d.served_model)
    return web.Response(text=text, content_type="text/plain")


async def openapi(request: web.Request) -> web.Response:
    return web.json_response({"openapi": "3.1.0", "info": {"title": "accelsim benchmark engine"},
                              "paths": {r: {} for r in ROUTES}})


@web.middleware
async def _bad_json(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        resp: web.StreamResponse = await handler(request)
    except (_BadRequest, KeyError) as exc:
        return _error(400, f"bad request: {exc}")
    return resp


def make_app(driver: EngineDriver) -> web.Application:
    app = web.Application(middlewares=[_bad_json], client_max_size=64 * 1024**2)
    app[DRIVER] = driver

    async def lifecycle(app: web.Application) -> Any:
        driver.start()
        yield
        await driver.stop()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_post("/inference/v1/generate", generate)
    r.add_post("/v1/completions", completions)
    r.add_post("/inference/v1/abort_requests", abort_requests)
    r.add_post("/abort_requests", abort_requests)
    r.add_post("/pause", pause)
    r.add_post("/resume", resume)
    r.add_get("/is_paused", is_paused)
    r.add_post("/reset_prefix_cache", reset_prefix_cache)
    r.add_post("/collective_rpc", collective_rpc)
    r.add_post("/update_weight_version", update_weight_version)
    r.add_get("/weight_info", weight_info)
    r.add_post("/v1/load_lora_adapter", load_lora)
    r.add_post("/v1/unload_lora_adapter", unload_lora)
    r.add_get("/v1/models", models)
    r.add_get("/health", health)
    r.add_get("/metrics", metrics)
    r.add_get("/openapi.json", openapi)
    return app
