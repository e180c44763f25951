import random, sqlite3
import pytest

def expected():
    r = random.Random(12)
    karma = {i: r.randint(0, 500) for i in range(1, 301)}
    banned = set(r.sample(range(1, 301), 23))
    return karma, banned

def test_schema():
    db = sqlite3.connect("/app/app.db")
    cols = {row[1]: row for row in db.execute("PRAGMA table_info(users)")}
    assert set(cols) == {"id", "login", "karma", "status"}
    st = cols["status"]
    assert st[2].upper() == "TEXT" and st[3] == 1 and st[4] in ("'active'", '"active"')
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "bans" not in tables

def test_data():
    karma, banned = expected()
    db = sqlite3.connect("/app/app.db")
    rows = db.execute("SELECT id, login, karma, status FROM users ORDER BY id").fetchall()
    assert [(i, f"u{i:03d}", karma[i], "banned" if i in banned else "active") for i in range(1, 301)] == rows
    db.execute("INSERT INTO users (id, login, karma) VALUES (1000, 'new', 1)")
    assert db.execute("SELECT status FROM users WHERE id = 1000").fetchone()[0] == "active"
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO users (id, login, karma, status) VALUES (1001, 'n2', 1, NULL)")
