#!/bin/bash
set -e
python3 - <<'EOF'
import math
from collections import defaultdict
d = defaultdict(list)
with open("/app/logs/requests.log") as f:
    for ln in f:
        kv = dict(p.split("=", 1) for p in ln.split())
        if kv["status"] == "200":
            d[kv["path"]].append(int(kv["duration_ms"]))
with open("/app/latency.csv", "w") as out:
    out.write("path,count,p95_ms,max_ms\n")
    for p in sorted(d):
        v = sorted(d[p])
        out.write(f"{p},{len(v)},{v[math.ceil(0.95 * len(v)) - 1]},{v[-1]}\n")
EOF
