import subprocess

def test_hidden_cases():
    r = subprocess.run(["node", "/tests/hidden.js"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "hidden ok" in r.stdout

def test_visible_suite():
    r = subprocess.run(["node", "/app/test.js"], capture_output=True, text=True, timeout=30, cwd="/app")
    assert r.returncode == 0, r.stderr[-2000:]
