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
