"""`rollbank collect --harness agent` takes the gateway's settings from the collect config's
`[gateway]` section: the gateway the collector builds enforces the file's limits."""

from __future__ import annotations

from pathlib import Path

import httpx

from rollbank.clock import MonotonicClock
from rollbank.collect_config import load_collect_config
from rollbank.collector import _agent_plane
from rollbank.gateway.app import build_app
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference_plane import InferencePlane
from rollbank.routing.factory import make_router

CONFIG = """
harness = "agent"
[inference]
kind = "fake"
[gateway]
max_tokens_cap = 64
default_max_tokens = 16
tool_parser = "pythonic"
"""


async def test_collect_config_gateway_section_reaches_the_agents_gateway(tmp_path: Path) -> None:
    path = tmp_path / "collect.toml"
    path.write_text(CONFIG)
    cfg = load_collect_config(path)
    assert (cfg.gateway.max_tokens_cap, cfg.gateway.tool_parser) == (64, "pythonic")
    tok = FakeTokenizer()
    _, clients = make_fake_fleet(1)
    clock = MonotonicClock()
    inference = InferencePlane({c.base_url: c for c in clients}, tok, tok.vocab_size, "fake")
    plane = _agent_plane(cfg, inference, make_router("round_robin", list(inference.clients), clock),
                         clock)
    assert plane is not None and plane.gateway.config == cfg.gateway
    gw = plane.gateway
    gw.root_url = "http://gw"
    h = gw.open_session("a", "g")
    user = [{"role": "user", "content": "hi"}]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(gw)),
                                 base_url="http://gw") as http:
        auth = {"Authorization": f"Bearer {h.api_key}"}
        over = await http.post(f"{h.base_url}/chat/completions", headers=auth,
                               json={"messages": user, "max_tokens": 65})
        ok = await http.post(f"{h.base_url}/chat/completions", headers=auth, json={"messages": user})
    assert over.status_code == 400 and over.json()["error"]["code"] == "over_limit"
    assert ok.status_code == 200, ok.text
    rec = await gw.close_session(h)
    assert [r.error_kind for r in rec.refused] == ["over_limit"]
    assert rec.requests[0].sampling["max_tokens"] == 16  # the file's default_max_tokens
