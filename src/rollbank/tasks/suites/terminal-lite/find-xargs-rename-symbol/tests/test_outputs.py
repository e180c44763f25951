from pathlib import Path

P = Path("/app/project")

def test_renamed():
    assert (P / "db.py").read_text() == "def fetch_rows(q):\n    return []\n\n\ndef fetch_rows_v10(q):\n    return [q]\n"
    assert (P / "api/handlers.py").read_text() == "from db import fetch_rows\n\n\ndef h(q):\n    return fetch_rows(q) + prefetch_rows_v1(q)\n\n\ndef prefetch_rows_v1(q):\n    return []\n"
    assert (P / "api/old handler.py").read_text() == 'import db\n\nrows = db.fetch_rows("x")  # fetch_rows is the loader\n'
    assert (P / "tools/migrate.py").read_text() == 'print("fetch_rows")\nfrom db import fetch_rows as f\n'

def test_untouched():
    assert (P / "vendor/lib/compat.py").read_text() == "def fetch_rows_v1():\n    pass\n"
    assert (P / "README.md").read_text() == "Call fetch_rows_v1(q) to load rows.\n"
    assert len([p for p in P.rglob("*") if p.is_file()]) == 6
