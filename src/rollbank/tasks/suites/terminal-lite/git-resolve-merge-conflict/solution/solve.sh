#!/bin/bash
set -e
cd /app/repo
git checkout -q main
git merge feature/retries || true
cat > config.py <<'EOF'
NAME = 'collector'
TIMEOUT_S = 120
MAX_RETRIES = 4
BACKOFF = 1.5
LOG_LEVEL = 'info'
STRAGGLER_FACTOR = 2.0
EOF
git add config.py
git commit --no-edit -q
git clean -fdq
