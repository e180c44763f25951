"""Routing: pure policies that choose an inference server per request.

Modules: ``router`` (the seam, in-flight load, ``RouteRequest``, ``RouterPolicy``),
``policies`` (round-robin, least-loaded, sticky), ``cache_aware``, ``blocks`` (token-block
hashes), ``config`` (``RouterConfig``), ``factory`` (``make_router``, ``router_from_config``).
The package imports nothing, so loading the configuration loads no policy code.
"""
