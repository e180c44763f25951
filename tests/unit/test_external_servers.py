"""A standard `vllm serve` (no VLLM_SERVER_DEV_MODE: no /weight_info) works with --servers
(issue 29, item 5): versions then come from rollbank's own publication records, labelled so;
``inference.external_versions = "engine"`` refuses it naming the URL and the flag; a dead URL
is named in the error."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rollbank.errors import ConfigError, ServerUnreachableError
from rollbank.inference.vllm_client import VLLMClient

URL = "http://vllm.example:8000"


def _standard_vllm(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/openapi.json":
        return httpx.Response(200, json={"paths": {"/v1/completions": {}, "/health": {}}})
    return httpx.Response(404, json={"detail": "Not Found"})  # /weight_info: dev mode only


def _make(url: str, **kw: Any) -> VLLMClient:
    return VLLMClient(url, transport=httpx.MockTransport(_standard_vllm), connect_retries=0, **kw)


async def test_a_standard_vllm_serve_takes_versions_from_rollbanks_records() -> None:
    from rollbank.inference_plane import ROLLBANK_VERSIONS, connect_external

    clients: dict[str, Any] = {}
    labels = await connect_external([URL + "/"], "auto", clients, _make)
    assert labels == {URL: ROLLBANK_VERSIONS} and "rollbank" in ROLLBANK_VERSIONS
    assert clients[URL].policy_version == 0
    for c in clients.values():
        await c.aclose()


async def test_engine_versions_refuse_a_standard_server_naming_url_and_flag() -> None:
    from rollbank.inference_plane import connect_external

    clients: dict[str, Any] = {}
    with pytest.raises(ConfigError) as exc:
        await connect_external([URL], "engine", clients, _make)
    assert URL in str(exc.value) and "--inference.external-versions rollbank" in str(exc.value)
    for c in clients.values():
        await c.aclose()


async def test_a_dead_url_is_named() -> None:
    client = VLLMClient("http://127.0.0.1:9", connect_retries=0, connect_timeout_s=1)
    with pytest.raises(ServerUnreachableError) as exc:
        await client.connect()
    await client.aclose()
    assert "http://127.0.0.1:9" in str(exc.value)


async def test_a_standard_vllm_serve_keeps_its_prefix_cache_after_calibration_said() -> None:
    """The newcomer's path (README: `rollbank collect --servers` on a plain `vllm serve`)
    ended in `POST /reset_prefix_cache: HTTP 404` right after calibrating: the route is dev
    mode only. The reset is skipped for such a server, and said."""
    from rollbank.errors import RouteMissingError
    from rollbank.inference_plane import InferencePlane, connect_external

    clients: dict[str, Any] = {}
    await connect_external([URL], "auto", clients, _make)
    with pytest.raises(RouteMissingError):
        await clients[URL].reset_prefix_cache()
    plane = InferencePlane(clients=clients, tokenizer=None, vocab_size=256, description="")  # type: ignore[arg-type]
    said: list[str] = []
    await plane.reset_caches(said.append)
    assert len(said) == 1 and URL in said[0] and "VLLM_SERVER_DEV_MODE=1" in said[0]
    for c in clients.values():
        await c.aclose()
