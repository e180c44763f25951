#!/bin/bash
set -e
awk '{print $1}' /app/access.log | sort | uniq -c | sort -rn | head -5 | awk '{print $2, $1}' > /app/top_ips.txt
