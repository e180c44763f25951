"""rollbank.memory: freed allocator memory goes back to the OS (real glibc, real pyarrow)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from rollbank.memory import release_freed_memory, rss_mib

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")


@glibc
def test_free_chunks_glibc_keeps_are_returned() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    # 96 MiB of 16 KiB chunks (below the mmap threshold: they live in the arena), touched,
    # each followed by a small live chunk: once the big ones are freed the arena is full of
    # holes that neither coalesce nor sit at the top, so glibc keeps them resident
    chunks, pins = [], []
    for _ in range(96 * 64):
        p = libc.malloc(16384)
        libc.memset(p, 1, 16384)
        chunks.append(p)
        pins.append(libc.malloc(64))
    for p in chunks:
        libc.free(p)
    held = rss_mib()
    try:
        r = release_freed_memory()
        assert r.glibc
        assert r.rss_before_mib >= held - 8
        # the freed 96 MiB was resident before and is not after (margin for other threads)
        assert r.rss_before_mib - r.rss_after_mib > 64, r
    finally:
        for p in pins:
            libc.free(p)


def test_arrow_pool_is_asked_once_pyarrow_is_loaded() -> None:
    import pyarrow as pa

    table = pa.table({"x": list(range(100_000))})
    del table
    r = release_freed_memory()
    assert r.arrow
    assert r.seconds < 5.0  # a sanity bound on a call that must not block for long
    assert set(r.to_dict()) == {"rss_before_mib", "rss_after_mib", "seconds", "glibc", "arrow"}
