#!/bin/bash
set -e
python3 - <<'EOF'
import csv
depts = {r["dept_id"]: r["dept_name"] for r in csv.DictReader(open("/app/departments.csv"))}
rows = sorted((r["name"], depts[r["dept_id"]]) for r in csv.DictReader(open("/app/employees.csv")) if r["dept_id"] in depts)
with open("/app/joined.csv", "w") as f:
    f.write("name,dept_name\n")
    for n, d in rows:
        f.write(f"{n},{d}\n")
EOF
