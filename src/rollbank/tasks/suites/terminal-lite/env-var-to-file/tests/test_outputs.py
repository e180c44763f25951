from pathlib import Path

def test_token():
    assert Path("/app/token.txt").read_text().strip() == "rb-7f3a9c2e-0451"
