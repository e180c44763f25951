#!/bin/bash
set -e
cd /app/repo
git bisect start main v1.0 > /dev/null
git bisect run python3 check.py > /tmp/bisect.log 2>&1
git rev-parse refs/bisect/bad > /app/first_bad.txt
git bisect reset > /dev/null 2>&1
git checkout -q main
