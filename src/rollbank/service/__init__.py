"""The collector as an HTTP service a trainer in another process drives (``rollbank
serve-collector``; see docs/service.md).

- :mod:`~rollbank.service.config`: ``[service]`` settings (address, token, leases) on top of
  ``rollbank collect``'s configuration; the bearer token's sources.
- :mod:`~rollbank.service.leases`: pure state machine of written batches, leases and
  acknowledgements (injected clock).
- :mod:`~rollbank.service.hub`: the asyncio driver around it (long poll, back-pressure,
  version announcements, status).
- :mod:`~rollbank.service.app`: the FastAPI routes (thin), bearer-token check on every route.
- :mod:`~rollbank.service.run`: opens the planes, runs the collection and the HTTP server.
- :mod:`~rollbank.service.client`: a small httpx client for trainers.

FastAPI and uvicorn come from the ``service`` extra and are imported where the app is built.
"""
