"""``rollbank bench gateway --fake``: one short run, the JSON's shape (no timing asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rollbank_bench import gateway


def test_fake_run_reports_both_arms_the_hop_and_the_host_load(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    gateway.add_arguments(parser)
    out = tmp_path / "g.json"
    args = parser.parse_args(["--fake", "--pairs", "4", "--agents", "3", "--turns", "2",
                              "--out", str(out)])
    assert gateway.run(args) == 0
    data = json.loads(out.read_text())
    assert data == json.loads(capsys.readouterr().out)
    assert data["engine"] == "fake" and data["cpus"] >= 1
    assert len(data["host_load_start"]) == len(data["host_load_end"]) == 3
    for arm in ("completions", "chat"):
        assert set(data[arm]) == {"direct", "engine_client", "gateway", "added",
                                  "added_vs_engine_client", "gateway_inside", "http_hop",
                                  "gateway_own"}
        assert all(data[arm][k]["n"] == 4 for k in data[arm])
        assert data[arm]["engine_client"]["p50_ms"] > 0
        assert data[arm]["http_hop"]["p50_ms"] > 0  # the wall time includes the record's total
    assert data["met"] == (data["completions"]["added"]["p50_ms"] <= 2.0)
    lo, hi = data["completions"]["added"]["p50_ci95_ms"]
    assert lo <= data["completions"]["added"]["p50_ms"] <= hi
    assert data["direct_arm"].startswith("engine client")
    assert data["throughput"]["requests"] == 6
    assert data["throughput"]["gateway"]["completion_tokens_per_s"] > 0


def test_the_forwarder_passes_the_body_on_and_the_answer_back_unchanged_and_its_control_sleeps() -> None:
    import asyncio

    import httpx

    from rollbank.gateway.serve import bind
    from rollbank_bench.gateway_forwarder import forwarding

    seen: list[tuple[str, bytes]] = []

    async def engine(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def, type-arg]
        if scope["type"] != "http":
            return
        body = (await receive())["body"]
        seen.append((scope["path"], body))
        answer = b'{"echo": ' + body + b"}"
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    async def main() -> None:
        import uvicorn

        sock = bind("127.0.0.1", 0)
        server = uvicorn.Server(uvicorn.Config(engine, log_level="warning", lifespan="off"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            async with forwarding(f"http://127.0.0.1:{sock.getsockname()[1]}") as url, \
                    httpx.AsyncClient() as http:
                r = await http.post(f"{url}/inference/v1/generate", content=b'{"token_ids": [1, 2]}')
                assert (r.status_code, r.json()) == (201, {"echo": {"token_ids": [1, 2]}})
                slept = (await http.post(f"{url}/_sleep/5", content=b"{}")).json()["inside_s"]
                at_once = (await http.post(f"{url}/_sleep/0", content=b"{}")).json()["inside_s"]
                assert slept >= 0.004 > at_once  # the control's handler slept, or did not
        finally:
            server.should_exit = True
            await task
            sock.close()

    asyncio.run(main())
    assert seen == [("/inference/v1/generate", b'{"token_ids": [1, 2]}')]
