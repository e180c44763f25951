#!/bin/bash
set -e
{
  echo 'id,customer,country,items,total'
  jq -r 'sort_by(.id)[] | [.id, .customer.name, .customer.country, (.items|length), ((.items | map(.qty * .price) | add) * 100 | round / 100)] | @csv' /app/orders.json
} | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
w = csv.writer(sys.stdout, lineterminator="\n")
w.writerow(rows[0])
for r in rows[1:]:
    w.writerow(r[:4] + ["%.2f" % float(r[4])])
' > /app/orders.csv
