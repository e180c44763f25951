"""Router configuration: one :class:`RouterConfig` section for every policy.

Defaults follow the SGLang/vLLM-router cache-aware policy where they translate (cache
threshold 0.3), with imbalance thresholds scaled to RL rollout concurrency (tens of requests
per server, not thousands) and 16-token blocks as in vLLM's GPU paged KV cache (set
``block_size`` to the engine's; vLLM CPU uses 128 unless told otherwise).

Why the imbalance bar is high (abs 16 AND 2x): agent conversations spend much of their life in
tool calls, so in-flight counts swing even when the sessions per server are even; moving a
conversation costs a full re-prefill of its context on the new server, and new GRPO groups
are already placed on the least-loaded server, which corrects drift for free. Measured on two
vLLM servers (``rollbank bench routing``): abs 8 / rel 1.5 broke affinity 11 times in 192
requests and doubled the repeated prefill; abs 16 / rel 2.0 broke it 0 times. Load counts
conversations parked in tool calls too (``session_idle_s``; :mod:`rollbank.routing.cache_aware`).
"""

from __future__ import annotations

from pydantic import Field

from rollbank.config import Section
from rollbank.routing.router import RouterPolicy


class RouterConfig(Section):
    """How requests are spread over inference servers."""

    policy: RouterPolicy = Field(
        default=RouterPolicy.CACHE_AWARE,
        description="Routing policy: round_robin, least_loaded, sticky (per trajectory) or "
        "cache_aware (prefix affinity on token blocks, load-bounded, GRPO groups together).",
    )
    block_size: int = Field(
        default=16, ge=1, le=4096,
        description="Tokens per hashed block; match the engine's KV block size for accuracy.",
    )
    cache_threshold: float = Field(
        default=0.3, ge=0.0, le=1.0,
        description="cache_aware: minimum fraction of the prompt's blocks a server must "
        "already hold for prefix affinity to decide; below it, trajectory/group affinity or "
        "the least-loaded server decides.",
    )
    new_group_cache_threshold: float = Field(
        default=0.9, ge=0.0, le=1.0,
        description="cache_aware: a request whose trajectory and GRPO group were never seen "
        "(a new group) follows a prefix only if a server holds at least this fraction of it "
        "(e.g. another group of the same task); otherwise it goes to the least-loaded server, "
        "so a shared few-shot header alone does not pile new groups onto one server.",
    )
    balance_abs_threshold: int = Field(
        default=16, ge=0,
        description="cache_aware: affinity is broken only if the preferred server has "
        "more than this many in-flight requests above the least-loaded one ...",
    )
    balance_rel_threshold: float = Field(
        default=2.0, ge=1.0,
        description="... AND more than this factor times the least-loaded server's in-flight "
        "requests (both conditions: real imbalance, not noise).",
    )
    session_idle_s: float = Field(
        default=30.0, ge=0.0,
        description="cache_aware: a conversation whose request finished stays counted as load "
        "on its server for up to this long (it is in a tool call and will come back), so "
        "affinity is not broken, nor a new group placed, on in-flight counts that dip while "
        "conversations sit in tools; 0: load is requests in flight only.",
    )
    eviction_s: float = Field(
        default=600.0, gt=0.0,
        description="cache_aware: a block not routed for this long is assumed evicted by the "
        "server.",
    )
    max_blocks_per_server: int = Field(
        default=65536, ge=1,
        description="cache_aware: capacity of the believed prefix cache per server, in blocks "
        "(approximate the server's KV capacity / block size); LRU beyond it.",
    )
    max_sessions: int = Field(
        default=100_000, ge=1,
        description="sticky/cache_aware: how many trajectory and group affinities are "
        "remembered (least recently used dropped first).",
    )
    hash_memo_tokens: int = Field(
        default=1 << 23, ge=0,
        description="cache_aware: prompt token ids remembered per trajectory so that a turn "
        "hashes only its new blocks (~8 bytes a token while the caller holds the same ids; "
        "least recently used trajectories dropped first, then hashed whole; 0: every prompt "
        "hashed whole).",
    )
