import hashlib, json, random, time, urllib.error, urllib.request

SERVER = '\nimport configparser\nimport hashlib\nimport json\nfrom http.server import BaseHTTPRequestHandler, ThreadingHTTPServer\nfrom urllib.parse import parse_qs, urlparse\n\ncfg = configparser.ConfigParser()\nif not cfg.read("/app/svc/service.ini"):\n    raise SystemExit("missing /app/svc/service.ini")\nhost = cfg["server"]["host"]\nport = cfg.getint("server", "port")\nrounds = cfg.getint("index", "rounds")\nwith open(cfg["index"]["words_file"]) as f:\n    words = f.read().split()\n\n# Warm-up: build the digest index (takes several seconds).\nindex = {}\nfor w in words:\n    h = w.encode()\n    for _ in range(rounds):\n        h = hashlib.sha256(h).digest()\n    index[w] = h.hex()[:16]\n\n\nclass Handler(BaseHTTPRequestHandler):\n    def reply(self, code, obj):\n        data = json.dumps(obj).encode()\n        self.send_response(code)\n        self.send_header("Content-Type", "application/json")\n        self.send_header("Content-Length", str(len(data)))\n        self.end_headers()\n        self.wfile.write(data)\n\n    def do_GET(self):\n        u = urlparse(self.path)\n        if u.path == "/health":\n            return self.reply(200, {"status": "ok", "words": len(index)})\n        if u.path == "/lookup":\n            w = parse_qs(u.query).get("word", [""])[0]\n            if w in index:\n                return self.reply(200, {"word": w, "digest": index[w]})\n            return self.reply(404, {"error": "unknown word"})\n        self.reply(404, {"error": "not found"})\n\n    def log_message(self, *args):\n        pass\n\n\nThreadingHTTPServer((host, port), Handler).serve_forever()\n'

def get(path):
    try:
        r = urllib.request.urlopen("http://127.0.0.1:8090" + path, timeout=5)
        return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())

def words():
    r = random.Random(8090)
    return sorted({''.join(r.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(r.randint(4, 9))) for _ in range(1600)})

def digest(w):
    h = w.encode()
    for _ in range(5000):
        h = hashlib.sha256(h).digest()
    return h.hex()[:16]

def test_service_answers():
    deadline = time.time() + 3
    while True:
        try:
            code, body = get("/health")
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    ws = words()
    assert code == 200 and body["words"] == len(ws)
    for w in (ws[0], ws[len(ws) // 2], ws[-1]):
        assert get("/lookup?word=" + w) == (200, {"word": w, "digest": digest(w)})
    assert get("/lookup?word=zzzzzzzzzzzz")[0] == 404

def test_server_unmodified():
    assert open("/app/svc/server.py").read() == SERVER.lstrip("\n")
