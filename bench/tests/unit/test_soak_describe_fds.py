"""`soak.describe_fds`: what a soak's counted descriptors are, so a drained reading that moves
names the descriptors that moved (a TCP connection's ports and state, a pipe, a file)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from rollbank_bench.soak_probe import describe_fds, open_fds


def test_names_tcp_connections_with_ports_and_state_pipes_and_files(tmp_path: Path) -> None:
    before = describe_fds()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    acc, _ = srv.accept()
    r, w = os.pipe()
    f = (tmp_path / "held").open("w")
    try:
        now = describe_fds()
        grew = {k: v - before["by_kind"].get(k, 0) for k, v in now["by_kind"].items()}
        assert grew.get("tcp") == 3 and grew.get("pipe") == 2 and grew.get("file", 0) >= 1
        text = "\n".join(now["fds"])
        assert f":{port}->:0 LISTEN" in text
        assert f"->:{port} ESTABLISHED" in text and f":{port}->:" in text
        assert str(tmp_path / "held") in text
        assert len(now["fds"]) == open_fds() == sum(now["by_kind"].values())
    finally:
        for s in (cli, acc, srv):
            s.close()
        os.close(r)
        os.close(w)
        f.close()
