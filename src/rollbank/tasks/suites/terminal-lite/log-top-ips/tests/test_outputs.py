from pathlib import Path

def test_top5():
    got = [ln.split() for ln in Path("/app/top_ips.txt").read_text().strip().splitlines()]
    assert got == [["203.0.113.7", "913"], ["198.51.100.23", "771"], ["192.0.2.146", "642"],
                   ["203.0.113.99", "518"], ["198.51.100.4", "405"]]
