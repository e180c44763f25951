import csv, io, random

def make_sales():
    r = random.Random(99)
    cats = ["Books, Used", "Books", "Garden", "Toys", "Kitchen", "Audio \"Pro\""]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["id", "date", "category", "amount", "region"])
    for i in range(1, 2501):
        w.writerow([i, f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}", r.choice(cats),
                    f"{r.randint(100, 99999) / 100:.2f}", r.choice(["north", "south", "east", "west"])])
    return buf.getvalue()

from decimal import Decimal
from pathlib import Path

def expected():
    tot = {}
    for row in csv.DictReader(io.StringIO(make_sales())):
        tot[row["category"]] = tot.get(row["category"], Decimal(0)) + Decimal(row["amount"])
    return sorted(((c, f"{v:.2f}") for c, v in tot.items()), key=lambda kv: -Decimal(kv[1]))

def test_totals():
    rows = list(csv.reader(io.StringIO(Path("/app/totals.csv").read_text())))
    assert rows[0] == ["category", "total"]
    assert [tuple(r) for r in rows[1:] if r] == expected()
