"""Hand freed memory back to the operating system (the collector calls it at each batch hand-off).

A long-running collector frees most of what a batch allocated (trajectories, Parquet buffers),
but the allocators keep the freed pages: glibc's malloc keeps free chunks inside its arenas
(one per thread that allocated, so the executor's workers add theirs) and Arrow's memory pool
(mimalloc or jemalloc) keeps freed pages for reuse. Resident memory then climbs to the
allocators' high-water mark instead of following what is live. Measured in the 30-minute
faulted soak (``rollbank bench soak --faults``): the collector's live heap (glibc in-use bytes,
Python's allocated blocks, gc objects) stayed flat while RSS rose by ~45 MiB over 15 minutes,
mostly free memory held in glibc's arenas and Arrow's pool.

:func:`release_freed_memory` asks both to return what they hold free: ``malloc_trim(0)``
(glibc only; every arena, including free pages in the middle of a heap) and Arrow's
``MemoryPool.release_unused()`` (only if pyarrow is already imported: this module imports
nothing heavy). It is synchronous and takes a few milliseconds: call it off the event loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MemoryRelease", "release_freed_memory", "rss_mib"]


@dataclass(frozen=True)
class MemoryRelease:
    """What one release did: resident memory before and after, and how long it took."""

    rss_before_mib: float
    rss_after_mib: float
    seconds: float
    glibc: bool  # malloc_trim was available and called
    arrow: bool  # pyarrow was loaded and its pool asked

    def to_dict(self) -> dict[str, Any]:
        return {"rss_before_mib": self.rss_before_mib, "rss_after_mib": self.rss_after_mib,
                "seconds": self.seconds, "glibc": self.glibc, "arrow": self.arrow}


def rss_mib(status: Path = Path("/proc/self/status")) -> float:
    """This process's resident set (VmRSS) in MiB; 0.0 where /proc is not available."""
    try:
        text = status.read_text()
    except OSError:
        return 0.0
    kib = next((int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("VmRSS:")), 0)
    return round(kib / 1024, 1)


@functools.cache
def _malloc_trim() -> Any | None:
    """glibc's ``malloc_trim``, or None (musl, macOS: no such call)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed_memory() -> MemoryRelease:
    """Return free allocator memory to the OS (see the module doc). Blocking: run it in a thread."""
    t0 = time.perf_counter()
    before = rss_mib()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    # None when pyarrow is not loaded (or only half-imported)
    pool = getattr(sys.modules.get("pyarrow"), "default_memory_pool", None)
    if pool is not None:
        pool().release_unused()
    return MemoryRelease(before, rss_mib(), round(time.perf_counter() - t0, 4),
                         trim is not None, pool is not None)
