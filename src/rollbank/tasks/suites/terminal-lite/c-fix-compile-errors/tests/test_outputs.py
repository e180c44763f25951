import os, subprocess

def test_build_and_behaviour(tmp_path):
    subprocess.run(["make", "-C", "/app", "clean"], capture_output=True)
    r = subprocess.run(["make", "-C", "/app"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "-Werror" in open("/app/Makefile").read()
    data = bytes(range(256)) * 37 + b"tail"
    p = tmp_path / "blob.bin"
    p.write_bytes(data)
    out = subprocess.run(["/app/csum", str(p)], capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.split() == [str(len(data)), str(sum(data) % 2**32), str(p)]
    bad = subprocess.run(["/app/csum", str(p), "/nonexistent/x"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stdout.startswith(str(len(data)))
