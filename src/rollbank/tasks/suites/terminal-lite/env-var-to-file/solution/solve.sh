#!/bin/bash
set -e
printf '%s\n' "$DEPLOY_TOKEN" > /app/token.txt
