#!/bin/bash
set -e
python3 - <<'EOF'
import csv
from decimal import Decimal
tot = {}
with open("/app/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        tot[row["category"]] = tot.get(row["category"], Decimal(0)) + Decimal(row["amount"])
with open("/app/totals.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["category", "total"])
    for c, v in sorted(tot.items(), key=lambda kv: -kv[1]):
        w.writerow([c, f"{v:.2f}"])
EOF
