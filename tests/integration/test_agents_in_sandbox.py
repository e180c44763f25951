"""The installed-agent pattern on real sandboxes: an agent inside a bubblewrap sandbox
(loopback-only network) reaches its gateway session through its one forwarded endpoint, and
nothing else: not the host's ports (the gateway's own included), not another attempt's
session. The engine is the scripted fake behind the real gateway over HTTP."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from gateway_rig import CHATML, make_rig

from rollbank.agents.contract import LLM
from rollbank.agents.forward import forwarded
from rollbank.agents.sandbox_api import AttemptSandbox
from rollbank.gateway.serve import running
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.protocol import SandboxSpec

pytestmark = pytest.mark.integration


@pytest.fixture
async def channel_backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    be = LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "run", agent_channels=True))
    try:
        yield be
    finally:
        await be.aclose()


def _get(path: str, key: str, port: int = 18080) -> str:
    """bash: one HTTP request over /dev/tcp, the status line printed (or 'refused')."""
    req = f"GET {path} HTTP/1.0\\r\\nHost: x\\r\\nAuthorization: Bearer {key}\\r\\n\\r\\n"
    return (f"if exec 3<>/dev/tcp/127.0.0.1/{port}; then printf '{req}' >&3; head -1 <&3; "
            f"else echo refused; fi 2>/dev/null")


async def test_an_agent_inside_reaches_its_gateway_and_nothing_else(
        channel_backend: LocalBackend, base: Path) -> None:
    rig = make_rig(template=CHATML)
    async with running(rig.gateway) as root:
        gw_port = int(root.rsplit(":", 1)[1])
        a = rig.gateway.open_session("g/s0/r0", "g")
        b = rig.gateway.open_session("g/s1/r0", "g")
        sb = await channel_backend.start(SandboxSpec(layers=(base,)))
        try:
            api = AttemptSandbox(sb, workdir="/", step_timeout_s=20, budget_s=None)
            async with forwarded(sb, LLM(a.base_url, a.api_key, a.model)) as fwd:
                assert fwd.llm.base_url == f"http://127.0.0.1:18080/s/{a.session_id}/v1"
                r = await api.exec(fwd.start)
                assert r.exit_code == 0, r.stderr
                own = await api.exec("bash -c " + repr(_get(f"/s/{a.session_id}/v1/models",
                                                             a.api_key)))
                other = await api.exec("bash -c " + repr(_get(f"/s/{b.session_id}/v1/models",
                                                               a.api_key)))
                stolen = await api.exec("bash -c " + repr(_get(f"/s/{b.session_id}/v1/models",
                                                                "guess")))
                host = await api.exec("bash -c " + repr(_get("/v1/models", a.api_key,
                                                              port=gw_port)))
                write = await api.exec("touch /run/rollbank/x && echo wrote || echo refused")
            assert own.stdout.startswith("HTTP/1.1 200"), own
            assert other.stdout.startswith("HTTP/1.1 401"), other  # A's key on B's session
            assert stolen.stdout.startswith("HTTP/1.1 401"), stolen
            assert host.stdout.strip() == "refused", host  # the host's ports: not reachable
            assert write.stdout.strip() == "refused"  # the channel is read-only inside
        finally:
            await sb.close()
        await rig.gateway.close_session(a)
        await rig.gateway.close_session(b)
