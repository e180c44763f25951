#!/bin/bash
set -e
{
  echo "plan,events,active_users,net_revenue_cents"
  sqlite3 -csv /app/events.db "SELECT u.plan, COUNT(*), COUNT(DISTINCT e.user_id),
    SUM(CASE e.kind WHEN 'purchase' THEN e.value_cents WHEN 'refund' THEN -e.value_cents ELSE 0 END)
    FROM events e JOIN users u ON u.id = e.user_id
    WHERE e.ts >= strftime('%s', '2024-03-01') AND e.ts < strftime('%s', '2024-04-01')
    GROUP BY u.plan ORDER BY u.plan;"
} > /app/march_by_plan.csv
