#!/bin/bash
set -e
python3 - <<'EOF'
import hashlib, json
v = json.load(open("/app/vault.json"))
for i in range(10000):
    pin = f"{i:04d}"
    if hashlib.pbkdf2_hmac("sha256", pin.encode(), v["salt"].encode(), v["iterations"]).hex() == v["hash"]:
        open("/app/pin.txt", "w").write(pin + "\n")
        break
EOF
