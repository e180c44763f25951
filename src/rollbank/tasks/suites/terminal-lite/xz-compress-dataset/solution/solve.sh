#!/bin/bash
set -e
xz -T1 -2 /app/telemetry.csv
