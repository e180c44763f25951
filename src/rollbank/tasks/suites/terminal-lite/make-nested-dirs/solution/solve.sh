#!/bin/bash
set -e
mkdir -p /app/data/raw/2024/q3 /app/data/processed
