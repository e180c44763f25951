import configparser
import hashlib
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

cfg = configparser.ConfigParser()
if not cfg.read("/app/svc/service.ini"):
    raise SystemExit("missing /app/svc/service.ini")
host = cfg["server"]["host"]
port = cfg.getint("server", "port")
rounds = cfg.getint("index", "rounds")
with open(cfg["index"]["words_file"]) as f:
    words = f.read().split()

# Warm-up: build the digest index (takes several seconds).
index = {}
for w in words:
    h = w.encode()
    for _ in range(rounds):
        h = hashlib.sha256(h).digest()
    index[w] = h.hex()[:16]


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        u = urlparse(self.path)
        if u.path == "/health":
            return self.reply(200, {"status": "ok", "words": len(index)})
        if u.path == "/lookup":
            w = parse_qs(u.query).get("word", [""])[0]
            if w in index:
                return self.reply(200, {"word": w, "digest": index[w]})
            return self.reply(404, {"error": "unknown word"})
        self.reply(404, {"error": "not found"})

    def log_message(self, *args):
        pass


ThreadingHTTPServer((host, port), Handler).serve_forever()
