import json, math, os, random, subprocess, sys, tempfile

# The agent's package runs in a child process as nobody, never imported here: code under test
# cannot write /logs/verifier or signal this runner, so it cannot forge the reward.
CHILD = r"""
import json, sys
sys.path.insert(0, "/app")
from geo import haversine_km, route_length_km

req = json.load(sys.stdin)
pairs = [haversine_km(tuple(a), tuple(b)) for a, b in req["pairs"]]
routes = [route_length_km([tuple(p) for p in pts]) for pts in req["routes"]]
print(json.dumps({"pairs": pairs, "routes": routes}))
"""


def agent_run(pairs=(), routes=()):
    home = tempfile.mkdtemp()
    os.chown(home, 65534, 65534)
    r = subprocess.run([sys.executable, "-I", "-c", CHILD],
                       input=json.dumps({"pairs": list(pairs), "routes": list(routes)}),
                       user=65534, group=65534, extra_groups=[], cwd=home,
                       env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                       capture_output=True, text=True, timeout=40)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got["pairs"]) == len(pairs) and len(got["routes"]) == len(routes)
    return got

def ref(a, b):
    la1, lo1, la2, lo2 = map(math.radians, (*a, *b))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371.0088 * math.asin(math.sqrt(h))

def test_pairs():
    r = random.Random(99)
    pairs = []
    for _ in range(2000):
        a = (r.uniform(-89, 89), r.uniform(-180, 180))
        b = (r.uniform(-89, 89), r.uniform(-180, 180))
        pairs.append((a, b))
    got = agent_run(pairs=pairs)["pairs"]
    for (a, b), d in zip(pairs, got):
        assert math.isclose(d, ref(a, b), rel_tol=1e-9, abs_tol=1e-9), (a, b)

def test_routes():
    r = random.Random(7)
    routes = []
    for n in (0, 1, 2, 3, 50):
        routes.append([(r.uniform(-60, 60), r.uniform(-170, 170)) for _ in range(n)])
    got = agent_run(routes=routes)["routes"]
    for pts, length in zip(routes, got):
        want = sum(ref(pts[i], pts[i + 1]) for i in range(len(pts) - 1))
        assert math.isclose(length, want, rel_tol=1e-9, abs_tol=1e-9), len(pts)

def test_suite_untouched():
    src = open("/app/tests/test_geo.py").read()
    assert "for _ in range(400):" in src and "def slow_reference" in src
