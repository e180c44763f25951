import random, sqlite3, sys

def main(path):
    r = random.Random(4242)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, plan TEXT NOT NULL, country TEXT NOT NULL)")
    db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, kind TEXT NOT NULL, ts INTEGER NOT NULL, value_cents INTEGER NOT NULL)")
    db.executemany("INSERT INTO users VALUES (?, ?, ?)",
                   ((i, r.choice(["free", "free", "pro", "team"]), r.choice(["NO", "SE", "DE", "US", "JP"])) for i in range(1, 50001)))
    kinds = ["view", "click", "purchase", "refund", "signup"]
    kw = [60, 30, 6, 1, 3]
    start = 1704067200  # 2024-01-01
    def rows():
        for i in range(1, 1500001):
            k = r.choices(kinds, weights=kw)[0]
            v = r.randint(100, 20000) if k in ("purchase", "refund") else 0
            yield (i, r.randint(1, 50000), k, start + r.randint(0, 182 * 86400), v)
    db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", rows())
    db.commit()
    db.close()

if __name__ == "__main__":
    main(sys.argv[1])
