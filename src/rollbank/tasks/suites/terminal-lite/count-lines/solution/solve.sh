#!/bin/bash
set -e
wc -l < /app/input.txt | tr -d ' ' > /app/count.txt
