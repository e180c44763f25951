import random, sys
from collections import OrderedDict
sys.path.insert(0, "/app")
from lru import LRUCache

class Ref:
    def __init__(self, cap):
        self.cap, self.d, self.hits, self.misses = cap, OrderedDict(), 0, 0
    def get(self, k, default=None):
        if k in self.d:
            self.hits += 1
            self.d.move_to_end(k)
            return self.d[k]
        self.misses += 1
        return default
    def put(self, k, v):
        self.d[k] = v
        self.d.move_to_end(k)
        while len(self.d) > self.cap:
            self.d.popitem(last=False)

def test_capacity_zero():
    c = LRUCache(0)
    c.put("a", 1)
    assert len(c) == 0 and c.get("a", "dflt") == "dflt"

def test_against_reference():
    r = random.Random(21)
    for cap in (1, 2, 3, 5):
        c, ref = LRUCache(cap), Ref(cap)
        for _ in range(2000):
            k = r.choice("abcdefg")
            if r.random() < 0.5:
                v = r.randint(0, 99)
                c.put(k, v); ref.put(k, v)
            else:
                assert c.get(k, -1) == ref.get(k, -1)
            assert len(c) == len(ref.d)
        assert (c.hits, c.misses) == (ref.hits, ref.misses)
