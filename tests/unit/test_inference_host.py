"""Host detection and the dtype / servers / threads choice, on recorded /proc/cpuinfo samples.

Samples (tests/fixtures/cpuinfo/): an AMD EPYC with AVX-512 and avx512_bf16 (Zen 4, recorded on
a development host), the same CPU with the AVX-512 flags removed (an AVX2-only Zen 2, as on the
issue's newcomer host), a Skylake Xeon with AVX-512 but no bf16, a Sapphire Rapids Xeon with AMX.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.inference.config import ServerConfig
from rollbank.inference.host import (
    HostFacts,
    cpu_list,
    detect_host,
    facts_from,
    headroom_cores,
    parse_cpuinfo,
    parse_meminfo,
    plan_inference,
)
from rollbank.inference.server import ManagedServers

SAMPLES = Path(__file__).parent.parent / "fixtures" / "cpuinfo"
MEMINFO_24G = "MemTotal:       24684084 kB\nMemFree:        19383292 kB\n"


def facts(sample: str, cores: int = 2, meminfo: str = MEMINFO_24G) -> HostFacts:
    return facts_from((SAMPLES / f"{sample}.txt").read_text(), meminfo, range(cores))


@pytest.mark.parametrize(
    ("sample", "isa", "bf16", "dtype"),
    [
        ("epyc-rome-avx2", "avx2 only", False, "float32"),
        ("xeon-skylake-avx512", "avx512f without bf16", False, "float32"),
        ("epyc-genoa-avx512-bf16", "avx512_bf16", True, "bfloat16"),
        ("xeon-sapphire-rapids-amx", "amx_bf16", True, "bfloat16"),
    ],
)
def test_dtype_follows_native_bf16(sample: str, isa: str, bf16: bool, dtype: str) -> None:
    f = facts(sample)
    assert f.isa == isa
    assert f.native_bf16 is bf16
    assert plan_inference(f).dtype == dtype


def test_parse_cpuinfo_takes_model_and_first_flags() -> None:
    model, flags = parse_cpuinfo((SAMPLES / "xeon-skylake-avx512.txt").read_text())
    assert model == "Intel(R) Xeon(R) Platinum 8175M CPU @ 2.50GHz"
    assert {"avx2", "avx512f"} <= flags and "avx512_bf16" not in flags
    assert parse_cpuinfo("") == ("unknown CPU", frozenset())
    # ARM lists its features under "Features"
    assert "asimd" in parse_cpuinfo("processor : 0\nFeatures : fp asimd bf16\n")[1]


def test_parse_meminfo() -> None:
    assert parse_meminfo(MEMINFO_24G) == pytest.approx(23.54, abs=0.01)
    assert parse_meminfo("nothing here") == 0.0


def test_two_core_host_runs_one_server_on_both_cores() -> None:
    plan = plan_inference(facts("epyc-rome-avx2", cores=2))
    assert (plan.num_servers, plan.threads_per_server, plan.binds) == (1, 2, ("0-1",))
    line = plan.line()
    assert line.startswith("host: AMD EPYC, 2 cores, 24 GiB, avx2 only -> dtype float32, 1 server x 2 threads")
    assert "no native bf16" in line


def test_big_host_keeps_headroom_and_splits_cores() -> None:
    plan = plan_inference(facts("xeon-sapphire-rapids-amx", cores=32, meminfo="MemTotal: 134217728 kB\n"))
    assert headroom_cores(32) == 8
    assert (plan.num_servers, plan.threads_per_server) == (3, 8)
    assert plan.binds == ("0-7", "8-15", "16-23")


def test_memory_caps_the_server_count() -> None:
    small = facts("epyc-genoa-avx512-bf16", cores=32, meminfo="MemTotal: 10485760 kB\n")  # 10 GiB
    plan = plan_inference(small, per_server_gib=4.0)
    assert plan.num_servers == 2 and plan.threads_per_server == 12
    assert "memory-capped" in plan.line()


def test_explicit_values_are_kept() -> None:
    plan = plan_inference(facts("epyc-rome-avx2", cores=2), dtype="bfloat16", num_servers=2, threads="auto")
    assert (plan.dtype, plan.num_servers, plan.threads_per_server) == ("bfloat16", 2, 1)
    assert plan.binds == ("0", "1")
    assert plan.reasons == ()
    assert plan_inference(facts("epyc-rome-avx2"), dtype=None).dtype is None


def test_binds_use_the_allowed_cpus_and_wrap() -> None:
    f = facts_from("", "", [2, 3, 5, 6])
    plan = plan_inference(f, num_servers=3, threads=2)
    assert plan.binds == ("2-3", "5-6", "2-3")
    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_detect_host_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text((SAMPLES / "xeon-skylake-avx512.txt").read_text())
    (tmp_path / "meminfo").write_text(MEMINFO_24G)
    f = detect_host(tmp_path)
    assert f.isa == "avx512f without bf16" and f.cores >= 1 and f.memory_gib > 23
    assert detect_host(tmp_path / "missing").flags == frozenset()


def test_managed_servers_use_the_plan(tmp_path: Path) -> None:
    ms = ManagedServers(ServerConfig(model="tiny", run_dir=tmp_path), host=facts("epyc-rome-avx2", cores=2))
    assert ms.plan.dtype == "float32" and ms.plan.num_servers == 1
    bf16 = ManagedServers(ServerConfig(model="tiny", compile="eager"), host=facts("xeon-sapphire-rapids-amx"))
    assert bf16._host_args() == ["--dtype", "bfloat16", "--enforce-eager"]
    assert ms._host_args() == ["--dtype", "float32"]


def test_server_config_rejects_bad_counts() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ServerConfig(num_servers=0)
    with pytest.raises(ValidationError):
        ServerConfig(threads=-1)
    assert ServerConfig(num_servers=3).num_servers == 3
