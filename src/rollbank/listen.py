"""The one TCP listener for rollbank's HTTP servers (the gateway, the collector service).

:func:`listen_tcp` makes a non-blocking listening socket whose accepted connections have
``TCP_NODELAY``. The protocol is named (``IPPROTO_TCP``, not 0): asyncio sets ``TCP_NODELAY``
on an accepted socket only when its ``proto`` says TCP, and an accepted socket inherits the
listener's. Without it uvicorn's response head and body go out as two writes under Nagle and
the body waits for the client's delayed ACK of the head, ~40 ms on every kept-alive request
(measured on the gateway: its whole "added latency" in ``rollbank bench gateway``).
``TCP_NODELAY`` is also set on the listener (Linux passes it on to accepted sockets) in case
another event loop skips the check.
"""

from __future__ import annotations

import socket

from rollbank.errors import ServiceError


def listen_tcp(host: str, port: int, *, backlog: int, port_flag: str) -> socket.socket:
    """A listening socket on ``host:port``; :class:`ServiceError` naming ``port_flag`` (the
    flag that chose the port) if it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ServiceError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another "
                           f"{port_flag} (0: any free port)") from exc
    sock.setblocking(False)
    return sock
