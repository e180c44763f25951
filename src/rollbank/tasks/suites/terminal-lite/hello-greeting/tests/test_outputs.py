from pathlib import Path

def test_greeting_content():
    p = Path("/app/greeting.txt")
    assert p.is_file(), "missing /app/greeting.txt"
    assert p.read_text().strip() == "hello rollbank"
