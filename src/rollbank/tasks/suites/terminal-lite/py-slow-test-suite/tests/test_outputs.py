import math, random, sys
sys.path.insert(0, "/app")
from geo import haversine_km, route_length_km

def ref(a, b):
    la1, lo1, la2, lo2 = map(math.radians, (*a, *b))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371.0088 * math.asin(math.sqrt(h))

def test_pairs():
    r = random.Random(99)
    for _ in range(2000):
        a = (r.uniform(-89, 89), r.uniform(-180, 180))
        b = (r.uniform(-89, 89), r.uniform(-180, 180))
        assert math.isclose(haversine_km(a, b), ref(a, b), rel_tol=1e-9, abs_tol=1e-9)

def test_routes():
    r = random.Random(7)
    for n in (0, 1, 2, 3, 50):
        pts = [(r.uniform(-60, 60), r.uniform(-170, 170)) for _ in range(n)]
        want = sum(ref(pts[i], pts[i + 1]) for i in range(n - 1))
        assert math.isclose(route_length_km(pts), want, rel_tol=1e-9, abs_tol=1e-9)

def test_suite_untouched():
    src = open("/app/tests/test_geo.py").read()
    assert "for _ in range(400):" in src and "def slow_reference" in src
