#!/bin/bash
set -e
cd /app/repo
sha=$(git log --format='%H %s' | awk '/Switch parser to strict mode/ {print $1}')
git revert --no-edit "$sha"
