#!/bin/bash
# Verifier with several named rewards: each group of checks (tests whose name contains
# the group) is run on its own and scored 1 or 0 in /logs/verifier/reward.json.
mkdir -p /logs/verifier
if [ -x /usr/bin/pytest ]; then PYTEST=(/usr/bin/pytest); else PYTEST=(python3 -m pytest); fi
cd /tests || exit 1
out="{"
sep=""
for group in dirs files scripts secrets; do
  if "${PYTEST[@]}" -q -p no:cacheprovider -rA /tests/test_outputs.py -k "test_${group}_"; then
    score=1
  else
    score=0
  fi
  out="${out}${sep}\"${group}\": ${score}"
  sep=", "
done
echo "${out}}" > /logs/verifier/reward.json
cat /logs/verifier/reward.json
