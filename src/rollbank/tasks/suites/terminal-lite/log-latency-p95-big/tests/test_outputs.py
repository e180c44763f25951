from pathlib import Path

WANT = [('/api/v1/batches', 37490, 620, 9807), ('/api/v1/groups', 94457, 138, 559), ('/api/v1/models', 28257, 33, 63), ('/api/v1/rollouts', 141407, 112, 765), ('/api/v1/sandboxes/fork', 23524, 558, 8928), ('/api/v1/verify', 18952, 936, 5427), ('/healthz', 118195, 3, 5), ('/metrics', 47471, 16, 45)]

def test_latency_table():
    lines = [ln.strip() for ln in Path("/app/latency.csv").read_text().strip().splitlines()]
    assert lines[0] == "path,count,p95_ms,max_ms"
    assert lines[1:] == [f"{p},{n},{p95},{mx}" for p, n, p95, mx in WANT]
