#!/bin/bash
set -e
d=$(mktemp -d)
cd "$d"
tar -xjf /app/bundle.tar.bz2
unzip -q inner.zip
mkdir p && tar -xzf payload.tar.gz -C p
find p -name flag.txt -exec grep -h '^FLAG{' {} + > /app/flag.txt
