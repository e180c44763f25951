#!/bin/bash
set -e
cd /app/dist
rm -f /app/release.zip
zip -r -q /app/release.zip . -x '*.map'
