"""A start is awaited on the anchor's ready byte, not polled (issue 26's start cost), REAL sandboxes.

``rb-helper anchor READY_FD`` writes one byte on a pipe the backend waits on
(:func:`rollbank.sandbox.local.backend._wait_ready`). Before, the backend polled ``/proc``
with a growing back-off (0.5 ms x 1.5 per probe), so every start was rounded up to its next
probe: a start 0.5 ms slower (the full id range's mapper) showed ~2.5 ms slower in
``bench sandbox``'s warm start.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollbank.errors import SandboxStartError
from rollbank.sandbox.local import backend as backend_mod
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.protocol import SandboxSpec

pytestmark = pytest.mark.integration


def _fds(pid: int) -> list[str]:
    return sorted(p.name for p in Path(f"/proc/{pid}/fd").iterdir())


def _no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    async def polled(*_: object) -> int:
        raise AssertionError("the start polled /proc for the anchor")

    monkeypatch.setattr(backend_mod, "_wait_anchor", polled)


@pytest.mark.parametrize("full", [True, False], ids=["full-range", "root-only"])
async def test_start_and_fork_wait_on_the_anchor_not_a_poll(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch, full: bool
) -> None:
    _no_poll(monkeypatch)
    cfg = LocalSandboxConfig(run_dir=tmp_path / "run", userns_full_range=full)
    async with LocalBackend(cfg) as be:
        sb = await be.start(SandboxSpec(layers=(base,)))
        assert isinstance(sb, LocalSandbox)
        assert (await sb.exec("echo up")).stdout == "up\n"
        # the pid the byte's credentials gave is the anchor's (the init's child, pid 1 inside)
        assert sb.anchor_pid == backend_mod._anchor_of(sb.init_pid)
        assert (await sb.exec("cat /proc/1/comm")).stdout == "rollbank-init\n"
        # the anchor kept no descriptor of the host (the pipe's end included): 0, 1, 2 only
        assert _fds(sb.anchor_pid) == ["0", "1", "2"]
        # the full range's mapper (bubblewrap's child once the init exec'd it) is gone and
        # reaped, no zombie left: bubblewrap's only child is the anchor
        for _ in range(1000):
            if backend_mod._children(sb.init_pid) == [sb.anchor_pid]:
                break
            await asyncio.sleep(0.01)
        assert backend_mod._children(sb.init_pid) == [sb.anchor_pid]
        snap = await sb.snapshot()
        group = await be.fork(snap, 8)
        assert len({s.anchor_pid for s in group if isinstance(s, LocalSandbox)}) == 8
        for s in group:
            assert (await s.exec("cat /etc/hostname")).ok


async def test_an_init_dying_before_its_anchor_reports_why(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End of file on the pipe (the init died first) is the init's error, not a hang."""
    from rollbank.sandbox.local import runtime

    real = runtime.init_argv

    def no_bwrap(**kw: Any) -> list[str]:
        return real(**{**kw, "bwrap": str(tmp_path / "no-bwrap")})

    async with LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "run")) as be:
        assert (await (await be.start(SandboxSpec(layers=(base,)))).exec("true")).ok
        monkeypatch.setattr(backend_mod, "init_argv", no_bwrap)
        with pytest.raises(SandboxStartError,
                           match="sandbox init exited: rb-helper: exec bwrap: "):
            await be.start(SandboxSpec(layers=(base,)))
        assert len(be.sandboxes) == 1


async def test_the_shell_path_still_polls(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without rb-helper the anchor is ``sleep``, which cannot say when it runs."""
    calls: list[int] = []
    real = backend_mod._wait_anchor

    async def counted(*a: object) -> int:
        calls.append(1)
        return await real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(backend_mod, "_wait_anchor", counted)
    async with LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "run", use_helper=False)) as be:
        sb = await be.start(SandboxSpec(layers=(base,)))
        assert (await sb.exec("echo up")).stdout == "up\n"
    assert calls == [1]
