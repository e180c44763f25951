#!/bin/bash
set -e
redis-server --port 6390 --bind 127.0.0.1 --daemonize yes --save '' --appendonly no --dir /tmp --logfile /tmp/redis.log
for i in $(seq 1 50); do redis-cli -p 6390 PING > /dev/null 2>&1 && break; sleep 0.1; done
awk '{print "SET", $1, $2}' /app/seed.txt | redis-cli -p 6390 > /dev/null
redis-cli -p 6390 SET seed:count "$(wc -l < /app/seed.txt | tr -d ' ')" > /dev/null
