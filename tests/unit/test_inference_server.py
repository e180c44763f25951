"""ManagedServers lifecycle against a stand-in server process (no vLLM needed).

``ServerConfig.python`` points at a small script that ignores ``-m vllm...`` and serves
``/health`` on ``--port`` (and logs every request), so start-up, supervision, restart and
clean stop are exercised with real processes in a fraction of a second. The same paths
against real vLLM are in tests/integration/test_vllm_server.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from rollbank.errors import InferenceError
from rollbank.inference.config import ServerConfig
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference.server import ManagedServers

STAND_IN = '''
import http.server, json, os, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = os.environ.get("STAND_IN_MODE", "ok")
if mode == "crash":
    sys.exit(3)
gate = os.environ.get("STAND_IN_GATE")  # the first server serves at once, the others on the gate
if gate:
    import time
    try:
        os.close(os.open(gate + ".first", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        while not os.path.exists(gate):
            time.sleep(0.05)
        if open(gate).read().strip() == "crash":
            sys.exit(4)
log = open(os.environ["STAND_IN_LOG"], "a")

class H(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        log.write(json.dumps({"port": port, "path": self.path, "body": body, "env": {
            k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_HUB", "KMP_", "OMP_"))}}) + "\\n")
        log.flush()
        out = b'{"weight_version": "default"}' if self.path == "/weight_info" else b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = _answer
    def log_message(self, *a): pass

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    exe = tmp_path / "fake-python"
    exe.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {script} "$@"\n')  # drop "-m vllm..."
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("STAND_IN_LOG", str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv("ROLLBANK_CACHE", str(tmp_path / "cache"))
    return exe


def config(exe: Path, tmp_path: Path, **kw: object) -> ServerConfig:
    return ServerConfig(
        model="tiny", python=str(exe), run_dir=tmp_path / "run", health_interval_s=60, startup_timeout_s=30, **kw  # type: ignore[arg-type]
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def requests(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_start_environment_and_clean_stop(stand_in: Path, tmp_path: Path) -> None:
    async with ManagedServers(config(stand_in, tmp_path, num_servers=2)) as ms:
        plan_binds = ms.plan.binds
        pids = [s.process.pid for s in ms.servers if s.process is not None]
        assert len(set(ms.urls)) == 2 and all([await c.health() for c in ms.clients])
        assert all(os.getpgid(p) == p for p in pids)  # each in its own process group
        cmd = ms.command(ms.servers[0])
        for flag in ("--enable-prefix-caching", "--max-model-len", "--max-logprobs", "--seed"):
            assert flag in cmd
        assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert not any(alive(p) for p in pids)
    env = requests(tmp_path)[0]["env"]
    assert isinstance(env, dict)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["KMP_BLOCKTIME"] == "0" and env["OMP_WAIT_POLICY"] == "PASSIVE"  # no spinning
    binds = {r["port"]: r["env"]["VLLM_CPU_OMP_THREADS_BIND"] for r in requests(tmp_path)}  # type: ignore[index]
    assert sorted(binds.values()) == sorted(plan_binds)  # each server on its own cores (host plan)
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "compile" / "vllm")  # reused when warm
    # vllm-cpu 0.32 + torch 2.13 cannot load its own AOT artifacts: off, so warm starts hit the
    # inductor cache instead of recompiling every time
    assert env["VLLM_USE_AOT_COMPILE"] == "0"


async def test_dead_process_is_restarted_on_same_url_with_weights(stand_in: Path, tmp_path: Path) -> None:
    async with ManagedServers(config(stand_in, tmp_path)) as ms:
        await ms.reload_weights("/ckpt/5", version=5)
        url = ms.urls[0]
        first = ms.servers[0].process
        assert first is not None
        os.killpg(first.pid, signal.SIGKILL)
        await first.wait()
        reasons = await ms.check_now()
        assert reasons[0] is not None and "exited" in reasons[0]
        assert ms.servers[0].restarts == 1 and ms.urls[0] == url
        assert await ms.clients[0].health() and ms.clients[0].policy_version == 5
        assert await ms.check_now() == [None]
    rpc = [r for r in requests(tmp_path) if r["path"] == "/collective_rpc"]
    assert len(rpc) == 2  # the publication, then its re-application after the restart
    assert json.loads(str(rpc[-1]["body"]))["kwargs"] == {"weights_path": "/ckpt/5"}
    assert [e["event"] for e in ms.events] == ["healthy", "dead", "healthy", "restarted"]


async def test_a_restarted_server_reloads_the_served_adapter_before_taking_requests(
        stand_in: Path, tmp_path: Path) -> None:
    """Regression (#10): with LoRA publication a restarted engine came back without the
    adapter its client's requests name, so they failed. It now loads the remembered adapter
    under the same name and names its version before any request reaches it."""
    async with ManagedServers(config(stand_in, tmp_path)) as ms:
        client = ms.clients[0]
        await client.connect()
        client.model = "policy-v3"  # what the lora pattern routed the client to
        ms.remember_adapter("policy-v3", "/run/weights/v000003", 3)
        held: list[asyncio.Task[object]] = []

        def on_ready(_i: int, _s: float) -> None:  # the new engine is healthy, not yet re-loaded
            held.append(asyncio.create_task(client.generate(GenerateRequest("held", [1, 2]))))

        ms.on_ready = on_ready
        first = ms.servers[0].process
        assert first is not None
        os.killpg(first.pid, signal.SIGKILL)
        await first.wait()
        await ms.check_now()
        assert held and client.hold.is_open
        await asyncio.gather(*held, return_exceptions=True)  # the stand-in's {} is no result
        assert client.policy_version == 3
    after = [r for r in requests(tmp_path)][-4:]
    assert [r["path"] for r in after] == [
        "/health", "/v1/load_lora_adapter", "/update_weight_version", "/inference/v1/generate"]
    assert json.loads(str(after[1]["body"])) == {"lora_name": "policy-v3",
                                                 "lora_path": "/run/weights/v000003"}
    assert json.loads(str(after[2]["body"])) == {"new_version": "3"}
    assert json.loads(str(after[3]["body"]))["model"] == "policy-v3"
    assert [e["event"] for e in ms.events][-2:] == ["healthy", "restarted"]


async def test_crash_at_startup_is_an_error_naming_the_log(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "crash")
    ms = ManagedServers(config(stand_in, tmp_path))
    with pytest.raises(InferenceError, match=r"exited with 3 during startup; see .*server-0\.log"):
        async with ms:
            pass
    assert all(s.process is not None and s.process.returncode is not None for s in ms.servers)


def test_config_rejects_typos() -> None:
    from rollbank.config import validate
    from rollbank.errors import ConfigError

    with pytest.raises(ConfigError, match="num_server"):
        validate(ServerConfig, {"num_server": 2}, source="serve.toml")


async def _until(cond, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    for _ in range(int(timeout_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_first_ready_serves_before_the_others_join(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = tmp_path / "gate"
    monkeypatch.setenv("STAND_IN_GATE", str(gate))
    ready: list[int] = []
    ms = ManagedServers(config(stand_in, tmp_path, num_servers=2), wait="first",
                        on_ready=lambda i, _s: ready.append(i))
    async with ms:
        assert len(ms.ready) == 1 and len(ready) == 1  # entered with one server serving
        seen = ms.watch()
        assert await anext(seen) == ms.ready
        assert await ms.check_now() == [None, None]  # the one still starting is not restarted
        gate.write_text("go")
        both = await anext(seen)
        assert set(both) == set(ms.urls) and sorted(ready) == [0, 1]
        assert await ms.settled() == both
        with pytest.raises(StopAsyncIteration):
            await anext(seen)  # every start settled: the feed ends


async def test_a_server_failing_after_another_serves_is_reported_not_raised(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = tmp_path / "gate"
    monkeypatch.setenv("STAND_IN_GATE", str(gate))
    failed: list[tuple[int, str]] = []
    ms = ManagedServers(config(stand_in, tmp_path, num_servers=2), wait="first",
                        on_failed=lambda i, exc: failed.append((i, str(exc))))
    async with ms:
        first = ms.ready
        gate.write_text("crash")
        assert await ms.settled() == first
        await _until(lambda: bool(failed))
        assert "exited with 4 during startup" in failed[0][1]
        assert [e["event"] for e in ms.events] == ["healthy", "start_failed"]
        assert all(s.process is None or s.process.returncode is not None
                   for s in ms.servers if s.index in ms.failed)


async def test_first_ready_fails_only_when_every_server_failed(
    stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "crash")
    ms = ManagedServers(config(stand_in, tmp_path, num_servers=2), wait="first")
    with pytest.raises(InferenceError, match="server 0 exited with 3"):
        async with ms:
            pass
