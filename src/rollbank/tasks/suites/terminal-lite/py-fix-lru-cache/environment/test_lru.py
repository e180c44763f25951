from lru import LRUCache


def test_eviction_order():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert c.get("b") is None
    assert c.get("a") == 1 and c.get("c") == 3


def test_overwrite():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("a", 2)
    assert len(c) == 1 and c.get("a") == 2


def test_counters():
    c = LRUCache(1)
    c.get("x")
    c.put("x", 1)
    c.get("x")
    assert (c.hits, c.misses) == (1, 1)
