import random, sys
sys.path.insert(0, "/app")
from intervals import merge

def reference(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]

def test_visible_cases():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]
    assert merge([]) == []

def test_random():
    r = random.Random(8)
    for _ in range(300):
        iv = []
        for _ in range(r.randint(0, 9)):
            s = r.randint(0, 40)
            iv.append((s, s + r.randint(0, 8)))
        before = list(iv)
        assert merge(iv) == reference(iv), iv
        assert iv == before
