"""In-memory fake inference server, client and tokenizer for unit tests and simulations.

One import site for the fakes: :class:`FakeInferenceServer` (``fake_server.py``: a simulated
engine; what it models is in that module's docstring), :class:`FakeInferenceClient`
(``fake_client.py``: an :class:`~rollbank.inference.protocol.InferenceClient` over one fake
server), :class:`FakeTokenizer` (``fake_tokenizer.py``: byte-level
:class:`~rollbank.inference.protocol.Tokenizer`) and :func:`make_fake_fleet`.
"""

from __future__ import annotations

from rollbank.inference.fake_client import FakeInferenceClient
from rollbank.inference.fake_server import FakeInferenceServer, Responder
from rollbank.inference.fake_tokenizer import FakeTokenizer

__all__ = [
    "FakeInferenceClient",
    "FakeInferenceServer",
    "FakeTokenizer",
    "Responder",
    "make_fake_fleet",
]


def make_fake_fleet(
    n: int, **server_kwargs: object
) -> tuple[list[FakeInferenceServer], list[FakeInferenceClient]]:
    """``n`` fake servers named ``fake://server-i`` with one client each."""
    servers = [
        FakeInferenceServer(base_url=f"fake://server-{i}", **server_kwargs)  # type: ignore[arg-type]
        for i in range(n)
    ]
    return servers, [FakeInferenceClient(s) for s in servers]
