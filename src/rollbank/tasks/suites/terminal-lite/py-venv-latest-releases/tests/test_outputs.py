import json
from pathlib import Path

def test_latest():
    got = json.loads(Path("/app/latest.json").read_text())
    assert got == {
        "rollbank": {"version": "1.10.0.post1", "released": "2024-03-05"},
        "sandboxer": {"version": "0.10", "released": "2023-12-20"},
        "routerd": {"version": "3.1.1", "released": "2024-01-17"},
    }

def test_venv_intact():
    import subprocess
    r = subprocess.run(["/opt/venv/bin/python", "-c", "import packaging, yaml, dateutil, requests; print('ok')"],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "ok"
