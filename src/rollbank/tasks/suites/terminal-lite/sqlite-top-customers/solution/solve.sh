#!/bin/bash
set -e
{
  echo "name,revenue"
  sqlite3 -csv /app/shop.db "SELECT c.name, printf('%.2f', SUM(i.qty * i.unit_price_cents) / 100.0) AS rev
    FROM customers c JOIN orders o ON o.customer_id = c.id JOIN order_items i ON i.order_id = o.id
    WHERE o.status = 'paid' GROUP BY c.id ORDER BY SUM(i.qty * i.unit_price_cents) DESC LIMIT 5;"
} > /app/top_customers.csv
