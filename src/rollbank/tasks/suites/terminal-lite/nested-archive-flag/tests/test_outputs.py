from pathlib import Path

def test_flag():
    assert Path("/app/flag.txt").read_text().strip() == "FLAG{n3sted-4rch1ves-0k}"
