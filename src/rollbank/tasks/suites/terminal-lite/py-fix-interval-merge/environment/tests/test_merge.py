import sys
sys.path.insert(0, "/app")
from intervals import merge


def test_simple():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_touching():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_unsorted():
    assert merge([(8, 10), (1, 3), (2, 4)]) == [(1, 4), (8, 10)]


def test_contained():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]
