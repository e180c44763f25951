#!/bin/bash
set -e
jq -r '.users[] | select(.active and .age >= 30) | .email' /app/users.json | sort > /app/emails.txt
