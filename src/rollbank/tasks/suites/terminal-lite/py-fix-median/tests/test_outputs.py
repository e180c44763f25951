import random, sys
sys.path.insert(0, "/app")
import stats

def test_known():
    assert stats.median([5, 1, 3]) == 3
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.median([7]) == 7
    assert stats.mean([1, 2, 3, 4]) == 2.5

def test_random_against_reference():
    import statistics
    r = random.Random(3)
    for _ in range(200):
        xs = [r.randint(-50, 50) for _ in range(r.randint(1, 12))]
        copy = list(xs)
        assert stats.median(xs) == statistics.median(copy)
        assert xs == copy, "median() must not modify its argument"
