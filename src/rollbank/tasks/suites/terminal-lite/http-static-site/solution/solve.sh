#!/bin/bash
set -e
cd /app/site
nohup setsid python3 -m http.server 8000 --bind 127.0.0.1 --directory /app/site > /tmp/http.log 2>&1 < /dev/null &
for i in $(seq 1 50); do curl -fs http://127.0.0.1:8000/index.html > /dev/null && break; sleep 0.1; done
