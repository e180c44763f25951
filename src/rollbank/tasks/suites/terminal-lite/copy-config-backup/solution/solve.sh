#!/bin/bash
set -e
mkdir -p /app/backup
cp /app/src/settings.ini /app/backup/settings.ini
