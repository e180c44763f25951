import os, subprocess

def test_executable():
    assert os.access("/app/run.sh", os.X_OK)
    out = subprocess.run(["/app/run.sh"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0
    assert out.stdout.strip() == "run ok: 42"
