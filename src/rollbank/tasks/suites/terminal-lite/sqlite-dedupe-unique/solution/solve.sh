#!/bin/bash
set -e
sqlite3 /app/contacts.db "DELETE FROM contacts WHERE id NOT IN (SELECT MIN(id) FROM contacts GROUP BY email);
  CREATE UNIQUE INDEX idx_contacts_email ON contacts(email);"
