#!/bin/bash
set -e
awk '$2 == "ERROR" {print substr($1, 1, 13)}' /app/app.log | sort | uniq -c \
  | jq -R -s 'split("\n") | map(select(length > 0) | capture("^ *(?<n>[0-9]+) (?<h>.*)$")) | map({(.h): (.n | tonumber)}) | add' > /app/errors_per_hour.json
