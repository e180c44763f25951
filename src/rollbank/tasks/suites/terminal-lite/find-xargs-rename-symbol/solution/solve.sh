#!/bin/bash
set -e
find /app/project -path /app/project/vendor -prune -o -type f -name '*.py' -print0 \
  | xargs -0 sed -i -E 's/\bfetch_rows_v1\b/fetch_rows/g'
