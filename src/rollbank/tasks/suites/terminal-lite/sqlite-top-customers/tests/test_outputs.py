import random, sqlite3

def make_shop(path):
    r = random.Random(404)
    db = sqlite3.connect(path)
    db.executescript("""
    CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT);
    CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), status TEXT);
    CREATE TABLE order_items (order_id INTEGER REFERENCES orders(id), sku TEXT, qty INTEGER, unit_price_cents INTEGER);
    """)
    names = ["Aurora Labs", "Basalt Co", "Cinder & Sons", "Delta Works", "Echo Foods", "Fjord AS",
             "Granite LLC", "Helix Bio", "Iris Media", "Juniper Tech", "Kestrel Air", "Lumen Ltd"]
    for i, n in enumerate(names, 1):
        db.execute("INSERT INTO customers VALUES (?, ?, ?)", (i, n, r.choice(["NO", "DE", "US"])))
    oid = 0
    for _ in range(400):
        oid += 1
        db.execute("INSERT INTO orders VALUES (?, ?, ?)", (oid, r.randint(1, len(names)), r.choice(["paid", "paid", "paid", "refunded", "pending"])))
        for _ in range(r.randint(1, 5)):
            db.execute("INSERT INTO order_items VALUES (?, ?, ?, ?)", (oid, f"S{r.randint(1, 80)}", r.randint(1, 9), r.randint(150, 40000)))
    db.commit()
    return db

from pathlib import Path

def test_top5():
    db = make_shop(":memory:")
    rows = db.execute("""SELECT c.name, SUM(i.qty * i.unit_price_cents) AS rev FROM customers c
        JOIN orders o ON o.customer_id = c.id JOIN order_items i ON i.order_id = o.id
        WHERE o.status = 'paid' GROUP BY c.id ORDER BY rev DESC LIMIT 5""").fetchall()
    want = ["name,revenue"] + [f"{n},{rev // 100}.{rev % 100:02d}" for n, rev in rows]
    got = [ln.strip() for ln in Path("/app/top_customers.csv").read_text().strip().splitlines()]
    got = [ln.replace('"', '') for ln in got]
    assert got == want
