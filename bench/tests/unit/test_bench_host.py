"""`bench host`: the dtype x compile arms it measures."""

from __future__ import annotations


def test_bench_host_arms() -> None:
    from rollbank_bench.host import _arms

    assert _arms("auto", "bfloat16") == [("bfloat16", "inductor"), ("bfloat16", "eager"),
                                         ("float32", "inductor"), ("float32", "eager")]
    assert _arms("float32:eager, bfloat16", None) == [("float32", "eager"), ("bfloat16", "inductor")]
    assert _arms("", "float32") == []
