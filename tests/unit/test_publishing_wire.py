"""The weight-sync routes of VLLMClient on the wire (httpx.MockTransport, no server)."""

from __future__ import annotations

import json

import httpx

from rollbank.inference.vllm_client import VLLMClient


async def test_weight_sync_routes_and_bodies() -> None:
    seen: list[tuple[str, str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.url.path, request.url.query.decode(), body))
        if request.url.path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": True})
        return httpx.Response(200, json={})

    client = VLLMClient("http://srv:8000", transport=httpx.MockTransport(handler), scale_out=True)
    await client.init_weight_transfer_engine({"directory": "/dev/shm"})
    await client.start_weight_update()
    await client.update_weights({"path": "/dev/shm/x", "names": ["a"]})
    await client.finish_weight_update(version=7)
    await client.set_weight_version(8)
    await client.reset_prefix_cache(reset_running_requests=True)
    assert seen == [
        ("/init_weight_transfer_engine", "", {"init_info": {"directory": "/dev/shm"}}),
        ("/start_weight_update", "", None),
        ("/update_weights", "", {"update_info": {"path": "/dev/shm/x", "names": ["a"]}}),
        ("/finish_weight_update", "", {"weight_version": "7"}),
        ("/update_weight_version", "", {"new_version": "8"}),
        ("/reset_prefix_cache", "reset_running_requests=true", None),
    ]
    assert client.policy_version == 8
    await client.aclose()
