#!/bin/bash
set -e
echo "hello rollbank" > /app/greeting.txt
