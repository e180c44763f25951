#!/usr/bin/env bash
# Idempotent set-up of .venv-harbor: a Python 3.12 venv with Harbor (PyPI `harbor`, needs
# Python >= 3.12) and rollbank's core in editable mode, for running Harbor trials on rollbank
# sandboxes (docs/harbor.md). Versions: constraints-harbor.txt (the tested set; harbor pinned).
# Called from scripts/setup.sh; ROLLBANK_SKIP_HARBOR=1 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${ROLLBANK_HARBOR_VENV:-$ROOT/.venv-harbor}
STAMP=$VENV/.rollbank-harbor-setup-v1
if [ -n "${ROLLBANK_SKIP_HARBOR:-}" ]; then
  echo "[setup-harbor] skipped (ROLLBANK_SKIP_HARBOR)"; exit 0
fi
PY=${ROLLBANK_HARBOR_PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.12 python3.13 /root/.pyenv/versions/3.12*/bin/python3 \
              "$HOME"/.pyenv/versions/3.12*/bin/python3 /root/.pyenv/versions/3.13*/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
      PY=$cand; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "[setup-harbor] no Python >= 3.12 found (set ROLLBANK_HARBOR_PYTHON); skipping .venv-harbor" >&2
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup-harbor] creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
want=$(cat pyproject.toml constraints-harbor.txt scripts/setup_harbor.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
  echo "[setup-harbor] installing harbor + rollbank core (first run: ~2-4 min)"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -c constraints-harbor.txt harbor -e .
  "$VENV/bin/python" -c "import harbor, rollbank.integrations.harbor.environment"
  echo "$want" > "$STAMP"
fi
echo "[setup-harbor] ok: $VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print("harbor", m.version("harbor"))'))"
