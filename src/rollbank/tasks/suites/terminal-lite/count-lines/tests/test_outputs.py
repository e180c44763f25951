from pathlib import Path

def test_count():
    got = Path("/app/count.txt").read_text().strip()
    assert got == "1237", got

def test_input_untouched():
    assert len(Path("/app/input.txt").read_text().splitlines()) == 1237
