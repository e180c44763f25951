#!/bin/bash
set -e
cd /app/repo
git log --format=%ae v1.0..v2.0 -- src/core/ | sort | uniq -c | sort -k1,1nr -k2,2 | awk '{print $1, $2}' > /app/core_authors.txt
