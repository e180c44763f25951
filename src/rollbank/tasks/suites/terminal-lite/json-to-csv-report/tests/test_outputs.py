import json, random

def make_orders():
    r = random.Random(31)
    names = [("Acme GmbH", "DE"), ("Borealis, Inc.", "US"), ("Cobalt SA", "FR"), ("Dune Ltd", "GB")]
    orders = []
    for oid in r.sample(range(1000, 9999), 60):
        name, country = r.choice(names)
        items = [{"sku": f"SKU-{r.randint(1, 50):03d}", "qty": r.randint(1, 5),
                  "price": r.randint(99, 25000) / 100} for _ in range(r.randint(1, 4))]
        orders.append({"id": oid, "customer": {"name": name, "country": country}, "items": items})
    return json.dumps(orders)

import csv, io
from decimal import Decimal, ROUND_HALF_UP
from pathlib import Path

def test_csv():
    rows = list(csv.reader(io.StringIO(Path("/app/orders.csv").read_text())))
    assert rows[0] == ["id", "customer", "country", "items", "total"]
    body = [r for r in rows[1:] if r]
    orders = sorted(json.loads(make_orders()), key=lambda o: o["id"])
    assert len(body) == len(orders)
    for row, o in zip(body, orders):
        total = sum(Decimal(str(i["qty"])) * Decimal(str(i["price"])) for i in o["items"])
        assert row[:4] == [str(o["id"]), o["customer"]["name"], o["customer"]["country"], str(len(o["items"]))]
        assert abs(Decimal(row[4]) - total) < Decimal("0.006"), (row, total)
        assert len(row[4].split(".")[1]) == 2
