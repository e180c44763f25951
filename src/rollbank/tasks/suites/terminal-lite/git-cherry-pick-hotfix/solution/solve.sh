#!/bin/bash
set -e
cd /app/repo
git checkout -q main
sha=$(git log hotfix --format='%H %s' | awk '/Fix off-by-one in paginate/ {print $1}')
git cherry-pick "$sha"
