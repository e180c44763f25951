#!/bin/bash
set -e
cd /app/repo
git checkout -q feature/csv
git reset --soft main
git commit -q -m "Add CSV exporter"
