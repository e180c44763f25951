#!/bin/bash
set -e
/opt/venv/bin/python - <<'EOF'
import json
import yaml
from dateutil import parser
from packaging.version import Version
data = yaml.safe_load(open("/app/releases.yaml"))["packages"]
out = {}
for name, rels in data.items():
    finals = [r for r in rels if not Version(r["version"]).is_prerelease]
    best = max(finals, key=lambda r: Version(r["version"]))
    out[name] = {"version": best["version"], "released": parser.parse(best["released"]).date().isoformat()}
json.dump(out, open("/app/latest.json", "w"), indent=2)
EOF
