"""Inference layer: token-level clients, managed vLLM servers, models, weight publication.

- :mod:`.protocol` — the seam (``InferenceClient``, ``GenerateRequest/Result``, ``Tokenizer``).
- :mod:`.fake` — in-memory server/client/tokenizer with a simulated prefix cache (unit tests).
- :mod:`.vllm_client` — the real client (vLLM OpenAI server, token ids in and out).
- :mod:`.sglang_client` — SGLang native API, checked only against a recorded contract.
- :mod:`.config` — ``ServerConfig``; :mod:`.server` — ``ManagedServers`` (start, supervise,
  restart, stop).
- :mod:`.models` / :mod:`.tokenizer` — ``ensure_model`` ("tiny", "gemma-3-270m", folder)
  and ``load_tokenizer``.
- :mod:`.publishing` — the one weight-publication seam (checkpoint, direct, colocated, lora).

Import the submodules directly; this package imports nothing heavy on its own.
"""
