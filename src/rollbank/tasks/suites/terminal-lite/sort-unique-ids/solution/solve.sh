#!/bin/bash
set -e
sort -n -u -S 256M /app/ids.txt > /app/unique_ids.txt
