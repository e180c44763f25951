import math
import random
import sys

import pytest

sys.path.insert(0, "/app")
from geo import haversine_km, route_length_km


def slow_reference(a, b, steps=400):
    """Distance by integrating along the great circle (slow but independent)."""
    def vec(p):
        la, lo = map(math.radians, p)
        return (math.cos(la) * math.cos(lo), math.cos(la) * math.sin(lo), math.sin(la))
    u, v = vec(a), vec(b)
    dot = max(-1.0, min(1.0, sum(x * y for x, y in zip(u, v))))
    ang = math.acos(dot)
    total = 0.0
    prev = u
    for k in range(1, steps + 1):
        t = k / steps
        if ang < 1e-12:
            break
        s1 = math.sin((1 - t) * ang) / math.sin(ang)
        s2 = math.sin(t * ang) / math.sin(ang)
        cur = tuple(s1 * x + s2 * y for x, y in zip(u, v))
        total += math.dist(prev, cur)
        prev = cur
    return total * 6371.0088


def test_known_distance():
    oslo, paris = (59.9139, 10.7522), (48.8566, 2.3522)
    assert haversine_km(oslo, paris) == pytest.approx(1342.0, abs=3.0)


def test_zero():
    assert haversine_km((10.0, 20.0), (10.0, 20.0)) == 0.0


@pytest.mark.parametrize("seed", range(12))
def test_random_pairs(seed):
    r = random.Random(seed)
    for _ in range(400):
        a = (r.uniform(-80, 80), r.uniform(-180, 180))
        b = (r.uniform(-80, 80), r.uniform(-180, 180))
        assert haversine_km(a, b) == pytest.approx(slow_reference(a, b), rel=1e-4)


@pytest.mark.parametrize("seed", range(6))
def test_routes(seed):
    r = random.Random(100 + seed)
    pts = [(r.uniform(-60, 60), r.uniform(-170, 170)) for _ in range(200)]
    want = sum(slow_reference(pts[i], pts[i + 1]) for i in range(len(pts) - 1))
    assert route_length_km(pts) == pytest.approx(want, rel=1e-4)


def test_short_routes():
    assert route_length_km([]) == 0.0
    assert route_length_km([(1.0, 1.0)]) == 0.0
    assert route_length_km([(0.0, 0.0), (0.0, 1.0)]) == pytest.approx(111.195, abs=0.01)
