from pathlib import Path

def test_upper():
    assert Path("/app/NAME.txt").read_text().split() == "ADA LOVELACE GRACE HOPPER BARBARA LISKOV".split()
    assert Path("/app/NAME.txt").read_text().strip().splitlines() == ["ADA LOVELACE", "GRACE HOPPER", "BARBARA LISKOV"]
