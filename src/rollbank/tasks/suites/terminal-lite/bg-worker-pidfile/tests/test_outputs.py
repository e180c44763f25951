import os, time
from pathlib import Path

def pid():
    return int(Path("/app/worker.pid").read_text().strip())

def test_process_running():
    p = pid()
    cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
    assert any(c.endswith(b"worker.py") for c in cmd), cmd
    env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
    assert b"WORKER_MODE=steady" in env

def test_heartbeats_flow():
    p = pid()
    before = Path("/app/heartbeat.log").read_text().splitlines()
    time.sleep(1.6)
    after = Path("/app/heartbeat.log").read_text().splitlines()
    assert len(after) >= len(before) + 2
    assert after[-1].endswith(f"mode=steady pid={p}")
