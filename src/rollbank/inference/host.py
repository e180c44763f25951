"""What this host can do for CPU inference, and the dtype / servers / threads chosen from it.

Pure functions over text and numbers (``/proc/cpuinfo``, ``/proc/meminfo``, the CPUs this
process may run on), so the choice is unit-tested on recorded samples; :func:`detect_host`
is the thin reader.

Rules (the reasons are printed with the choice, see :meth:`InferencePlan.line`)
- dtype: ``bfloat16`` only where the CPU computes bf16 natively (``avx512_bf16`` or
  ``amx_bf16``); elsewhere ``float32``. Without native bf16, vLLM CPU 0.32 falls back from
  oneDNN to torch linear layers: measured on a 2-core AVX2 host with Gemma 3 270M, bf16 gave
  13.8 tok/s alone and 20.8 tok/s at 16 concurrent, fp32 8.7 and 61.5.
- cores for inference = usable cores minus a headroom for sandboxes and verifiers
  (``cores // 4``, none below 4 cores: a 2-core host cannot spare one).
- servers = one per :data:`THREADS_PER_SERVER` inference cores (at least one), capped by memory
  (``per_server_gib`` each, leaving :data:`MEMORY_HEADROOM_GIB` for the rest);
  threads per server = inference cores // servers; server i is bound to its own cores.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
THREADS_PER_SERVER = 8
MEMORY_HEADROOM_GIB = 2.0

Auto = Literal["auto"]


@dataclass(frozen=True)
class HostFacts:
    """The facts the inference plan depends on."""

    cpu_model: str
    flags: frozenset[str]
    cpus: tuple[int, ...]  # CPU ids this process may run on
    memory_gib: float

    @property
    def cores(self) -> int:
        return len(self.cpus)

    @property
    def native_bf16(self) -> bool:
        return any(f in self.flags for f in NATIVE_BF16_FLAGS)

    @property
    def isa(self) -> str:
        """The most capable vector ISA level, as a short human label."""
        if "amx_bf16" in self.flags:
            return "amx_bf16"
        if "avx512_bf16" in self.flags:
            return "avx512_bf16"
        if "avx512f" in self.flags:
            return "avx512f without bf16"
        if "avx2" in self.flags:
            return "avx2 only"
        return "no avx2"


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """CPU model name and the flags of the first processor (x86 ``flags``, ARM ``Features``)."""
    model, flags = "unknown CPU", frozenset[str]()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and model == "unknown CPU":
            model = " ".join(value.split())
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return model, flags


def parse_meminfo(text: str) -> float:
    """``MemTotal`` in GiB (0.0 when absent)."""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) / (1024 * 1024) if m else 0.0


def facts_from(cpuinfo: str, meminfo: str, cpus: Sequence[int]) -> HostFacts:
    model, flags = parse_cpuinfo(cpuinfo)
    return HostFacts(model, flags, tuple(sorted(cpus)) or (0,), parse_meminfo(meminfo))


def detect_host(proc: Path = Path("/proc")) -> HostFacts:
    """Read this host's facts (missing files give an empty model/flag set, not an error)."""

    def read(name: str) -> str:
        try:
            return (proc / name).read_text()
        except OSError:
            return ""

    try:
        cpus: Sequence[int] = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = range(os.cpu_count() or 1)
    return facts_from(read("cpuinfo"), read("meminfo"), cpus)


def cpu_list(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the VLLM_CPU_OMP_THREADS_BIND syntax)."""
    parts: list[str] = []
    ids = sorted(cpus)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class InferencePlan:
    """dtype, servers and threads for this host, with why."""

    dtype: str | None  # None: the model config's dtype
    num_servers: int
    threads_per_server: int
    binds: tuple[str, ...]  # VLLM_CPU_OMP_THREADS_BIND per server
    facts: HostFacts
    reasons: tuple[str, ...]

    def line(self) -> str:
        """One line: ``host: AMD EPYC, 2 cores, avx2 only -> dtype float32, 1 server x 2 threads``."""
        f = self.facts
        what = (f"dtype {self.dtype or 'from the model'}, {self.num_servers} server"
                f"{'s' if self.num_servers != 1 else ''} x {self.threads_per_server} thread"
                f"{'s' if self.threads_per_server != 1 else ''}")
        why = f" ({'; '.join(self.reasons)})" if self.reasons else ""
        return (f"host: {f.cpu_model}, {f.cores} cores, {f.memory_gib:.0f} GiB, {f.isa} -> "
                f"{what}{why}")


def headroom_cores(cores: int) -> int:
    """Cores left to sandboxes and verifiers."""
    return cores // 4 if cores >= 4 else 0


def choose_dtype(facts: HostFacts) -> tuple[str, str]:
    if facts.native_bf16:
        return "bfloat16", "native bf16"
    return "float32", "no native bf16: oneDNN would fall back to slow torch linear"


def plan_inference(
    facts: HostFacts,
    *,
    dtype: str | Auto | None = "auto",
    num_servers: int | Auto = "auto",
    threads: int | Auto = "auto",
    per_server_gib: float = 4.0,
) -> InferencePlan:
    """Resolve every ``"auto"`` from ``facts``; explicit values are kept as given."""
    reasons: list[str] = []
    if dtype == "auto":
        dtype, why = choose_dtype(facts)
        reasons.append(why)
    spare = headroom_cores(facts.cores)
    inference_cores = max(1, facts.cores - spare)
    servers: int
    if num_servers == "auto":
        by_cores = max(1, inference_cores // THREADS_PER_SERVER)
        by_memory = max(1, int((facts.memory_gib - MEMORY_HEADROOM_GIB) // per_server_gib))
        servers = min(by_cores, by_memory) if facts.memory_gib > 0 else by_cores
        reasons.append(f"{spare} core(s) kept for sandboxes, one server per "
                       f"{THREADS_PER_SERVER} cores" + (", memory-capped" if by_memory < by_cores
                                                         else ""))
    else:
        servers = num_servers
    n_threads = max(1, inference_cores // servers) if threads == "auto" else threads
    binds = tuple(_bind(facts.cpus, i, n_threads) for i in range(servers))
    return InferencePlan(dtype, servers, n_threads, binds, facts, tuple(reasons))


def _bind(cpus: Sequence[int], index: int, threads: int) -> str:
    """Server ``index`` gets ``threads`` consecutive usable CPUs, wrapping around."""
    n = len(cpus)
    start = (index * threads) % n
    mine = sorted({cpus[(start + k) % n] for k in range(min(threads, n))})
    return cpu_list(mine)
