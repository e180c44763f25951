#!/bin/bash
set -e
tr -cs 'A-Za-z' '\n' < /app/book.txt | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c \
  | awk '{print $2, $1}' | sort -k2,2nr -k1,1 | head -10 > /app/top10.txt
