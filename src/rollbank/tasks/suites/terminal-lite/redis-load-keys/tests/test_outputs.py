import random, subprocess

def cli(*a):
    r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6390", *a], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()

def test_values():
    assert cli("PING") == "PONG"
    r = random.Random(6390)
    want = {f"user:{i}:score": str(r.randint(0, 10**6)) for i in range(1, 251)}
    keys = list(want)
    got = cli("MGET", *keys).splitlines()
    assert got == [want[k] for k in keys]
    assert cli("GET", "seed:count") == "250"
