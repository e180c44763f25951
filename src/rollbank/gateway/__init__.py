"""The OpenAI-compatible gateway: unmodified agent programs talk to rollbank's engines.

- :mod:`rollbank.gateway.config`: :class:`~rollbank.gateway.config.GatewaySection`.
- :mod:`rollbank.gateway.wire`: request bodies validated (400 naming the field).
- :mod:`rollbank.gateway.responses`: OpenAI response, stream-chunk and error bodies.
- :mod:`rollbank.gateway.sessions`: the pure session table (one key per attempt).
- :mod:`rollbank.gateway.transcript`: prefix reuse and edits over a token-exact chat session.
- :mod:`rollbank.gateway.records`: what is recorded per request and per session.
- :mod:`rollbank.gateway.gateway`: :class:`~rollbank.gateway.gateway.Gateway`, the driver
  (router, inference slot, admission gate, client).
- :mod:`rollbank.gateway.app`: the HTTP routes (FastAPI, thin) and the size limits.
- :mod:`rollbank.gateway.serve`: uvicorn on 127.0.0.1.

The package ``__init__`` imports nothing.
"""
