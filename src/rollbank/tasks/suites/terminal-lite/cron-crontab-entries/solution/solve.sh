#!/bin/bash
set -e
cat > /app/crontab <<'EOF'
30 2 * * * /app/bin/backup.sh
0 9 * * 1 /app/bin/report.sh
*/15 * * * * /app/bin/ping.sh
EOF
