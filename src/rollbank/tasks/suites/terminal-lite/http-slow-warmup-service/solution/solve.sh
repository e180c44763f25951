#!/bin/bash
set -e
cd /app/svc
sed -i -e 's/^port = .*/port = 8090/' -e 's#^words_file = .*#words_file = /app/svc/words.txt#' service.ini
nohup setsid python3 /app/svc/server.py > /tmp/svc.log 2>&1 < /dev/null &
for i in $(seq 1 600); do curl -fs http://127.0.0.1:8090/health > /dev/null && break; sleep 0.2; done
curl -fs http://127.0.0.1:8090/health
