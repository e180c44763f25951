#!/bin/bash
set -e
mv /app/report_draft.md /app/report_final.md
