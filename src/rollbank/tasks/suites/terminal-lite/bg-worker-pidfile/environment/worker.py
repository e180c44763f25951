import os
import sys
import time

mode = os.environ.get("WORKER_MODE", "unset")
with open("/app/heartbeat.log", "a", buffering=1) as f:
    n = 0
    while True:
        n += 1
        f.write(f"beat {n} mode={mode} pid={os.getpid()}\n")
        time.sleep(0.5)
