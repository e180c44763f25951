#!/bin/bash
set -e
tr '[:lower:]' '[:upper:]' < /app/name.txt > /app/NAME.txt
