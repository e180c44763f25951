#!/bin/bash
set -e
sqlite3 /app/app.db "ALTER TABLE users ADD COLUMN status TEXT NOT NULL DEFAULT 'active';
  UPDATE users SET status = 'banned' WHERE id IN (SELECT user_id FROM bans);
  DROP TABLE bans;"
