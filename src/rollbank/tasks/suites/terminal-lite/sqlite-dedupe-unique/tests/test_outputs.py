import random, sqlite3

def make_contacts(path):
    r = random.Random(77)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE contacts (id INTEGER PRIMARY KEY, email TEXT NOT NULL, name TEXT)")
    emails = [f"user{i}@mail.test" for i in range(150)]
    ids = r.sample(range(1, 5000), 400)
    for i in sorted(ids):
        db.execute("INSERT INTO contacts VALUES (?, ?, ?)", (i, r.choice(emails), f"n{i}"))
    db.commit()
    return db

import pytest

def test_rows():
    want = make_contacts(":memory:").execute("SELECT MIN(id), email, name FROM contacts GROUP BY email ORDER BY 1").fetchall()
    db = sqlite3.connect("/app/contacts.db")
    got = db.execute("SELECT id, email, name FROM contacts ORDER BY id").fetchall()
    assert got == [tuple(w) for w in want]

def test_unique_index():
    db = sqlite3.connect("/app/contacts.db")
    idx = {row[1]: row[2] for row in db.execute("PRAGMA index_list(contacts)")}
    assert idx.get("idx_contacts_email") == 1
    cols = [row[2] for row in db.execute("PRAGMA index_info(idx_contacts_email)")]
    assert cols == ["email"]
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("INSERT INTO contacts (id, email, name) VALUES (999999, 'user1@mail.test', 'x')")
