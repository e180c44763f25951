#!/bin/bash
set -e
python3 - <<'EOF'
import re
text = open("/app/notes.txt").read()
octet = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
pat = re.compile(r"(?<![0-9.])" + r"\.".join([octet] * 4) + r"(?![0-9]|\.[0-9])")
ips = sorted(set(pat.findall(text)), key=lambda s: tuple(int(x) for x in s.split(".")))
open("/app/ips.txt", "w").write("\n".join(ips) + "\n")
EOF
