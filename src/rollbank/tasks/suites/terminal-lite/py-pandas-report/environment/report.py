import pandas as pd

df = pd.read_csv("/app/data/sales.csv", parse_dates=["date"])
df["month"] = df["date"].dt.month

summary = pd.DataFrame()
for (region, month), g in df.groupby(["Region", "month"]):
    row = {"region": region, "month": month, "orders": len(g), "revenue": g["amount"].sum()}
    summary = summary.append(row, ignore_index=True)

summary["avg_order"] = summary["revenue"] / summary["orders"]
summary.to_csv("/app/out/report.csv")
