"""The gateway's one contact with uvicorn beyond its public API, version-checked: the httptools
HTTP protocol with a request-head limit.

uvicorn's httptools parser (llhttp) is faster than its h11 one (about 0.15 ms a request on
this 2-core machine with the fake engine, interleaved), but it has no head-size limit: a 40 MB
header would be buffered whole before the app's :class:`~rollbank.gateway.app.Limits` could
refuse it (issue 24 found that on the collector service). :func:`http_protocol` returns a
subclass of uvicorn's ``HttpToolsProtocol`` that counts the bytes received while a request's
head is incomplete and answers 431 and closes the connection once they pass the limit (with
at most one read of slack: one ``data_received`` chunk), as h11's
``h11_max_incomplete_event_size`` does.

It touches ``HttpToolsProtocol``'s ``data_received``, ``on_headers_complete``,
``on_message_complete`` and ``transport``: known for uvicorn :data:`SUPPORTED` (0.54.0 is the one tested). Outside that range, or without httptools,
:func:`http_protocol` returns ``"h11"`` (the parser that enforces the limit itself) and says why.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any

#: uvicorn releases whose HttpToolsProtocol is known here: [low, high)
SUPPORTED: tuple[tuple[int, int], tuple[int, int]] = ((0, 30), (0, 60))

_REFUSAL = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def _version() -> tuple[int, int] | None:
    """The installed uvicorn's (major, minor), None if it is absent or unreadable."""
    try:
        m = re.match(r"(\d+)\.(\d+)", metadata.version("uvicorn"))
    except metadata.PackageNotFoundError:
        return None
    return None if m is None else (int(m[1]), int(m[2]))


def http_protocol(max_header_bytes: int) -> tuple[Any, str]:
    """``(http, why)``: what to pass as ``uvicorn.Config(http=...)`` — the limited httptools
    protocol class, or ``"h11"`` — and a sentence saying which and why."""
    version = _version()
    if version is None or not SUPPORTED[0] <= version < SUPPORTED[1]:
        return "h11", (f"h11: uvicorn {version} is outside the range whose httptools protocol "
                       f"rollbank knows ({SUPPORTED[0]} to {SUPPORTED[1]})")
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError as exc:  # httptools not installed
        return "h11", f"h11: httptools is not available ({exc})"
    body = (b'{"error": {"message": "request head over the gateway\'s limit of %d bytes", '
            b'"type": "invalid_request_error", "param": null, "code": null}}' % max_header_bytes)
    refusal = _REFUSAL % (len(body), body)

    class LimitedHttpTools(HttpToolsProtocol):
        """httptools, with the request head limited to ``max_header_bytes``."""

        _head_bytes = 0
        _in_head = True

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._head_bytes > max_header_bytes \
                    and not self.transport.is_closing():
                self.transport.write(refusal)
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes = True, 0

    return LimitedHttpTools, f"httptools, request head limited to {max_header_bytes} bytes"
