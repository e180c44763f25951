import csv, os, random, subprocess
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

def reference():
    r = random.Random(2718)
    agg = defaultdict(lambda: [0, Decimal(0)])
    for i in range(1, 40001):
        date = f"2024-{r.randint(1, 9):02d}-{r.randint(1, 28):02d}"
        region = r.choice(['emea', 'apac', 'amer', 'latam'])
        status = r.choice(['completed', 'completed', 'completed', 'cancelled', 'pending'])
        amount = Decimal(f"{r.randint(100, 500000) / 100:.2f}")
        if status == "completed":
            a = agg[(region, date[:7])]
            a[0] += 1
            a[1] += amount
    return sorted((k[0], k[1], v[0], v[1]) for k, v in agg.items())

def test_rerun_output():
    out = Path("/app/out/report.csv")
    if out.exists():
        out.unlink()
    r = subprocess.run(["/opt/venv/bin/python", "/app/report.py"], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["region", "month", "orders", "revenue", "avg_order"]
    ref = reference()
    assert len(rows) - 1 == len(ref) == 36
    for row, (reg, month, n, rev) in zip(rows[1:], ref):
        assert row[:3] == [reg, month, str(n)], (row, reg, month, n)
        assert abs(Decimal(row[3]) - rev) <= Decimal("0.01"), (row, rev)
        assert abs(Decimal(row[4]) - rev / n) <= Decimal("0.011"), (row, rev / n)
