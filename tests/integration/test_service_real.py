"""`rollbank serve-collector` as its own process (real sandboxes, fake inference engine),
driven over HTTP by the client in this process: fetch, load, ack, announce a version, fetch
as Arrow, a lease that runs out is offered again, status and metrics, 401 without the token;
by default it exits 0 by itself once the collection finished and every batch is
acknowledged; SIGINT exits 130 and SIGTERM 143 after releasing everything."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rollbank.batching.loader import read_batch_dir, table_to_tensors
from rollbank.errors import ServiceError
from rollbank.service.client import CollectorClient, Fetched

pytestmark = pytest.mark.integration

SRC = Path(__file__).resolve().parents[2] / "src"
TOKEN = "integration-token-" + "7" * 16


def _line(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """The service's next JSON line on stdout (fails with its stderr if it ends first)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout_s):
        raise AssertionError(f"no line from the service within {timeout_s} s")
    line = proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        raise AssertionError(f"the service ended (rc {proc.wait()}): {proc.stderr.read()[-3000:]}")
    out: dict[str, Any] = json.loads(line)
    return out


def _fetch(client: CollectorClient, *, arrow: bool = False) -> Fetched:
    for _ in range(10):  # long polls of 60 s: a batch takes seconds with the fake engine
        got = client.next_batch(timeout_s=60, arrow=arrow)
        assert got is not None, "the collection ended early"
        if got.lease is not None:
            return got
    raise AssertionError("no batch in 10 minutes")


def test_service_process_driven_by_a_client(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "ROLLBANK_SERVICE_TOKEN": TOKEN,
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "rollbank.cli.main", "serve-collector",
           "--inference.kind", "fake", "--inference.calibrate", "false",
           "--set", 'include=["hello-greeting","count-lines"]',
           "--groups", "1", "--group-size", "2", "--pool-groups", "1", "--batches", "3",
           "--port", "0", "--service.lease-s", "3", "--service.max-unacked-batches", "1",
           "--service.exit-when-done", "false",  # kept serving after the last ack: status
           "--metrics.live", "off", "--metrics.report", "false", "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = _line(proc, 120)
        url = started["service"]
        assert url.startswith("http://127.0.0.1:")  # localhost unless configured
        assert json.loads((out / "service.json").read_text())["url"] == url

        # no token, a wrong token: 401 on every kind of route
        for path in ("/v1/status", "/metrics", "/openapi.json"):
            assert httpx.get(url + path).status_code == 401
        assert httpx.post(url + "/v1/batches/next", params={"timeout_s": 0}).status_code == 401
        with CollectorClient(url, "wrong-" + TOKEN) as bad, pytest.raises(ServiceError) as err:
            bad.status()
        assert err.value.status == 401

        with CollectorClient(url, TOKEN) as client:
            schema = httpx.get(url + "/openapi.json",
                               headers={"Authorization": f"Bearer {TOKEN}"}).json()
            assert "/v1/batches/next" in schema["paths"]

            # batch 0: fetch, load (verified checksum, torch tensors), ack
            b0 = _fetch(client)
            assert b0.lease is not None and b0.batch_index == 0 and b0.lease["delivery"] == 1
            table = read_batch_dir(Path(b0.lease["path"]))
            assert table.num_rows == b0.lease["rows"] == 2
            assert table_to_tensors(table).input_ids.shape[0] == 2
            assert client.ack(b0) is True
            assert client.ack(b0) is False  # a retried ack is safe

            # a trainer publishes version 1: the service hot-loads it on its engines
            ckpt = tmp_path / "weights" / "v000001"
            ckpt.mkdir(parents=True)
            from safetensors.torch import save_file

            save_file({"w": torch.zeros(2)}, str(ckpt / "model.safetensors"))
            pub = client.announce_version(1, checkpoint=str(ckpt))
            assert pub["applied"] is True and pub["detail"]["version"] == 1
            assert pub["detail"]["pattern"] == "checkpoint" and pub["detail"]["ok"] is True
            servers = pub["detail"]["servers"]
            assert len(servers) == 2 and pub["detail"]["serving"] == {s: 1 for s in servers}
            with pytest.raises(ServiceError) as err:
                client.announce_version(1)
            assert err.value.status == 409

            # batch 1 as an Arrow stream; not acknowledged: offered again once its lease ran out
            b1 = _fetch(client, arrow=True)
            assert b1.lease is not None and b1.table is not None and b1.batch_index == 1
            assert b1.table.equals(read_batch_dir(Path(b1.lease["path"])))
            again = _fetch(client)
            assert again.lease is not None and again.batch_index == 1
            assert again.lease["delivery"] == 2 and again.lease["lease_id"] != b1.lease["lease_id"]
            with pytest.raises(ServiceError) as err:
                client.ack(b1)  # the stale lease
            assert err.value.status == 409
            assert client.ack(again) is True

            b2 = _fetch(client)
            assert b2.batch_index == 2
            client.ack(b2)
            assert client.next_batch(timeout_s=60) is None  # finished, everything acknowledged

            status = client.status()
            assert status["run_id"] == started["run_id"] and status["state"] == "finished"
            assert status["version"] == 1 and status["in_flight"] == 0
            batches = status["batches"]
            assert (batches["written"], batches["acked"], batches["unacked"]) == (3, 3, 0)
            assert batches["redeliveries"] == 1 and batches["released"] == 0
            metrics = client.metrics()
            assert 'rollbank_service_batches{state="acked"} 3.0' in metrics
            assert "rollbank_service_weight_version 1.0" in metrics
            assert "rollbank_outcomes_total" in metrics  # the collection's own metrics

        # a real collection ran: real sandboxes, episodes recorded, summary written
        assert len(list((out / "episodes").glob("*.json"))) >= 6
        summary = json.loads((out / "summary.json").read_text())
        assert len(summary["batches"]) == 3
        (applied,) = [json.loads(x) for x in (out / "versions.jsonl").read_text().splitlines()]
        assert applied["version"] == 1 and applied["checkpoint"] == str(ckpt)
        resolved = json.loads((out / "config.resolved.json").read_text())
        assert resolved["service"]["token"] is None and TOKEN not in json.dumps(resolved)

        proc.send_signal(signal.SIGTERM)  # exit_when_done false: it serves until a signal
        assert proc.wait(timeout=60) == 143
        assert proc.stdout is not None
        last = json.loads(proc.stdout.read().splitlines()[-1])
        assert last["stopped"]["state"] == "finished" and last["stopped"]["batches"]["acked"] == 3
        assert last["stopped"]["signal"] == signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130)])
def test_a_signal_ends_the_service_with_its_exit_code(tmp_path: Path, sig: int, code: int) -> None:
    """Regression (issue 29): SIGINT ended serve-collector with exit 0, not 130."""
    env = {**os.environ, "ROLLBANK_SERVICE_TOKEN": TOKEN,
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "rollbank.cli.main", "serve-collector",
           "--inference.kind", "fake", "--inference.calibrate", "false",
           "--set", 'include=["hello-greeting"]', "--groups", "1", "--group-size", "2",
           "--pool-groups", "1", "--batches", "2", "--port", "0",
           "--metrics.live", "off", "--metrics.report", "false", "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _line(proc, 120)["service"]
        with CollectorClient(url, TOKEN) as client:  # collecting: ends says what it waits for
            assert "after the collection ends" in client.status()["ends"]
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


FAILING = Path(__file__).resolve().parents[1] / "fixtures" / "tasks-malformed" / "failing-run"


def test_a_failing_collection_is_reported_to_the_trainer_and_exits_3(tmp_path: Path) -> None:
    """A task whose environment build fails once the service is up: the waiting long poll is
    answered 410 with the error, the command ends with one error line and exit 3 (bad input).
    Before the fix the build error came out of the warm pool's TaskGroup as an exception
    group: a traceback and exit 1 (``rollbank collect`` too)."""
    out = tmp_path / "run"
    env = {**os.environ, "ROLLBANK_SERVICE_TOKEN": TOKEN,
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    common = ["--inference.kind", "fake", "--inference.calibrate", "false", "--tasks", str(FAILING),
              "--set", "include=[]", "--metrics.live", "off", "--metrics.report", "false"]
    proc = subprocess.Popen([sys.executable, "-m", "rollbank.cli.main", "serve-collector", *common,
                             "--port", "0", "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _line(proc, 120)["service"]
        # a long poll waiting while the environment is built is answered with the failure
        r = httpx.post(url + "/v1/batches/next", params={"timeout_s": 60}, timeout=90,
                       headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 410 and r.json()["state"] == "failed"
        assert r.json()["error"].startswith("BuildError: ") and "Dockerfile:3" in r.json()["error"]
        assert proc.wait(timeout=120) == 3
        assert proc.stderr is not None
        err = proc.stderr.read().strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rollbank serve-collector: error: ")
        assert "failing-run/environment/Dockerfile:3" in err[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done = subprocess.run([sys.executable, "-m", "rollbank.cli.main", "collect", *common,
                           "--out", str(tmp_path / "collect")],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0 and "Dockerfile:3" in done.stderr
