#!/bin/bash
# Verifier: runs the checks with the base image's pytest (offline, no downloads) and
# writes the reward: 1 if every check passed, 0 otherwise.
mkdir -p /logs/verifier
if [ -x /usr/bin/pytest ]; then PYTEST=(/usr/bin/pytest); else PYTEST=(python3 -m pytest); fi
cd /tests || exit 1
if "${PYTEST[@]}" -q -p no:cacheprovider -rA /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
