from pathlib import Path

WANT = ["0.0.0.0", "1.1.1.1", "8.8.4.4", "8.8.8.8", "10.0.0.1", "10.0.0.2", "127.0.0.1",
        "172.16.4.20", "172.16.254.1", "192.168.9.250", "192.168.10.3", "192.168.10.25",
        "255.255.255.255"]

def test_ips():
    got = [ln.strip() for ln in Path("/app/ips.txt").read_text().split("\n") if ln.strip()]
    assert got == WANT
