#!/bin/bash
set -e
mkdir -p /app/out
cat > /app/report.py <<'EOF'
import os

import pandas as pd

df = pd.read_csv("/app/data/sales.csv", parse_dates=["date"])
df = df[df["status"] == "completed"].copy()
df["month"] = df["date"].dt.strftime("%Y-%m")

summary = (
    df.groupby(["region", "month"])
    .agg(orders=("amount", "size"), revenue=("amount", "sum"))
    .reset_index()
    .sort_values(["region", "month"])
)
summary["avg_order"] = (summary["revenue"] / summary["orders"]).round(2)
summary["revenue"] = summary["revenue"].round(2)
os.makedirs("/app/out", exist_ok=True)
summary.to_csv("/app/out/report.csv", index=False, float_format="%.2f")
EOF
/opt/venv/bin/python /app/report.py
