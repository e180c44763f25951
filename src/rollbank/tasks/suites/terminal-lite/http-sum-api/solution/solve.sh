#!/bin/bash
set -e
cat > /app/sum_server.py <<'EOF'
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class H(BaseHTTPRequestHandler):
    def send(self, code, body, ctype="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        u = urlparse(self.path)
        if u.path == "/health":
            return self.send(200, "ok", "text/plain")
        if u.path == "/sum":
            q = parse_qs(u.query)
            try:
                a, b = int(q["a"][0]), int(q["b"][0])
            except (KeyError, ValueError):
                return self.send(400, json.dumps({"error": "a and b must be integers"}))
            return self.send(200, json.dumps({"sum": a + b}))
        self.send(404, json.dumps({"error": "not found"}))

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", 8081), H).serve_forever()
EOF
nohup setsid python3 /app/sum_server.py > /tmp/sum.log 2>&1 < /dev/null &
for i in $(seq 1 50); do curl -fs http://127.0.0.1:8081/health > /dev/null && break; sleep 0.1; done
