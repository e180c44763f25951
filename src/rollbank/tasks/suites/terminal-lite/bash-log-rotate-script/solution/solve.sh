#!/bin/bash
set -e
cat > /app/rotate.sh <<'EOF'
#!/bin/bash
d="$1"
if [ -z "$d" ] || [ ! -d "$d" ]; then
    echo "rotate.sh: not a directory: $d" >&2
    exit 2
fi
rm -f "$d/app.log.3"
for i in 2 1; do
    [ -e "$d/app.log.$i" ] && mv "$d/app.log.$i" "$d/app.log.$((i + 1))"
done
[ -e "$d/app.log" ] && mv "$d/app.log" "$d/app.log.1"
: > "$d/app.log"
exit 0
EOF
chmod +x /app/rotate.sh
