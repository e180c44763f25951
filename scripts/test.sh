#!/usr/bin/env bash
# The project's one test command: set-up, lint, strict typing, unit and integration tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not vllm").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
V=.venv/bin
echo "[test] ruff";  $V/ruff check src tests bench
echo "[test] mypy --strict"; $V/mypy
echo "[test] pytest"; $V/pytest -q -rs --durations=25 "$@"
