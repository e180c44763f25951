"""accelsim: an accelerator-regime inference engine emulator — a BENCHMARK INSTRUMENT only.

A separate server process (``python -m rollbank_bench.accelsim --profile P --port N``) that
speaks the vLLM 0.32 HTTP API :class:`rollbank.inference.vllm_client.VLLMClient` uses (token-id
prompts, token ids + log-probs + ``weight_versions`` out, usage with cached prompt tokens,
``/metrics`` prefix-cache counters, abort, pause/resume, reset_prefix_cache, reload = version
bump, LoRA names) and answers after the wall time an accelerator would take, while using
almost no CPU: it has no model, it sleeps. Collection runs and real-engine benchmarks stay on
real vLLM; this exists so ``rollbank bench`` can measure the accelerator regime on a CPU host.

Modules, one role each: :mod:`.profile` (latency profiles, TOML data with cited sources, and
the step-time model), :mod:`.tokens` (deterministic token ids / log-probs), :mod:`.core` (the
pure continuous-batching scheduler with a block-hashed LRU prefix cache), :mod:`.driver` (the
asyncio step loop in wall time), :mod:`.wire` (vLLM response bodies and metric names),
:mod:`.server` (aiohttp routes), :mod:`.process` (start/stop N engine processes),
:mod:`.offline` (the core over a trace in pure virtual time, for fitting profiles).
Benchmarks: ``rollbank bench accelsim-fidelity`` (emulated vs real vLLM CPU on one trace) and
``rollbank bench collect --engine accel-sim`` (the five arms in the accelerator regime).

Why not an existing simulator (checked on PyPI, 2026-11-30): ``vidur`` 0.0.26 is an offline
discrete-event simulator (no HTTP server, needs per-GPU operator profiles); ``vllm-mock`` 0.0.3
mocks the in-process ``vllm.LLM`` class (no server, no timing); ``xpyd-sim`` 0.5.0 serves
OpenAI ``/v1/completions`` with configurable latency but has no token-id outputs, no prefix
cache, no ``/inference/v1/generate`` with weight-version spans, and no abort/pause/weight/LoRA
control routes; ``aisimulate`` is not on the index. None can serve this API with token ids and
a prefix cache, so the engine is written here on rollbank's own block-hash prefix cache.
"""
