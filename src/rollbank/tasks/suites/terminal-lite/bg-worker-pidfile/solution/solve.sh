#!/bin/bash
set -e
cd /app
WORKER_MODE=steady nohup setsid python3 /app/worker.py > /dev/null 2>&1 < /dev/null &
echo $! > /app/worker.pid
sleep 1
