#!/bin/bash
set -e
cd /app/repo
sha=$(git reflog --format='%H %gs %s' | awk '/Add retry budget to scheduler/ {print $1; exit}')
git reset --hard "$sha"
