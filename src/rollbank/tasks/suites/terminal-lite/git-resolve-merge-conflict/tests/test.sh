#!/bin/bash
# Verifier with several named rewards: pytest runs once (junit XML); each group of checks
# (tests named test_<group>_...) scores 1 if all of its tests passed, else 0, in
# /logs/verifier/reward.json.
mkdir -p /logs/verifier
if [ -x /usr/bin/pytest ]; then PYTEST=(/usr/bin/pytest); else PYTEST=(python3 -m pytest); fi
cd /tests || exit 1
rm -f /logs/verifier/junit.xml
"${PYTEST[@]}" -q -p no:cacheprovider -rA --junitxml=/logs/verifier/junit.xml /tests/test_outputs.py
/usr/bin/python3 - merge content clean <<'EOF'
import json
import sys
import xml.etree.ElementTree as ET

groups = sys.argv[1:]
score = {g: 0 for g in groups}
try:
    seen = {g: 0 for g in groups}
    bad = {g: 0 for g in groups}
    for tc in ET.parse("/logs/verifier/junit.xml").getroot().iter("testcase"):
        for g in groups:
            if tc.get("name", "").startswith(f"test_{g}_"):
                seen[g] += 1
                if any(child.tag in ("failure", "error", "skipped") for child in tc):
                    bad[g] += 1
    score = {g: int(seen[g] > 0 and bad[g] == 0) for g in groups}
except (OSError, ET.ParseError) as exc:
    print(f"no usable junit report: {exc}")
with open("/logs/verifier/reward.json", "w") as f:
    json.dump(score, f)
print(json.dumps(score))
EOF
