#!/bin/bash
set -e
find /app/work -type f -name '*.tmp' -delete
