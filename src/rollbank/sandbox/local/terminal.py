"""A tmux terminal inside a sandbox, for keystroke agents (Terminus-style harnesses).

Owns :class:`TmuxTerminal`. It uses only :meth:`Sandbox.exec`, so it works on any backend
whose environment has ``tmux`` (every base from :mod:`rollbank.tasks.bases` does). The tmux
server runs inside the sandbox (it outlives the ``exec`` that started it, like any daemon a
command leaves behind) and dies with the sandbox.

Invariants
- Keys are sent literally (``send-keys -l``) unless named (``Enter``, ``C-c``...), so model
  text is never interpreted as tmux key names.
- Terminal operations are harness plumbing: they use ``exec`` with a short per-step timeout
  and are charged to the episode budget like any command (a keystroke agent's waiting time is
  the harness's to account for).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from rollbank.errors import SandboxError
from rollbank.sandbox.protocol import Sandbox

NAMED_KEYS = frozenset(
    {"Enter", "Tab", "Escape", "BSpace", "Up", "Down", "Left", "Right", "Home", "End",
     "PageUp", "PageDown", "Space", *(f"C-{c}" for c in "abcdefghijklmnopqrstuvwxyz"),
     *(f"M-{c}" for c in "abcdefghijklmnopqrstuvwxyz")}
)


class TmuxTerminal:
    """One tmux session ``name`` in ``sandbox`` with a fixed window size."""

    def __init__(self, sandbox: Sandbox, *, name: str = "agent", width: int = 160,
                 height: int = 48, timeout_s: float = 10.0) -> None:
        self.sandbox = sandbox
        self.name = name
        self.width = width
        self.height = height
        self.timeout_s = timeout_s

    async def _tmux(self, *args: str) -> str:
        cmd = shlex.join(["tmux", *args])
        r = await self.sandbox.exec(cmd, timeout_s=self.timeout_s)
        if not r.ok:
            raise SandboxError(f"tmux {args[0]} failed ({r.exit_code}): {r.stderr.strip()}")
        return r.stdout

    async def start(self, *, cwd: str = "/", shell: str = "/bin/bash") -> None:
        await self._tmux("new-session", "-d", "-s", self.name, "-x", str(self.width),
                         "-y", str(self.height), "-c", cwd, shell)

    async def send(self, keys: str | Sequence[str]) -> None:
        """Send text (literally) or a sequence mixing text and named keys (``Enter``...)."""
        for part in [keys] if isinstance(keys, str) else keys:
            if part in NAMED_KEYS:
                await self._tmux("send-keys", "-t", self.name, part)
            elif part:
                await self._tmux("send-keys", "-t", self.name, "-l", "--", part)

    async def capture(self, *, history: int = 0) -> str:
        """The visible screen (plus ``history`` lines of scrollback)."""
        args = ["capture-pane", "-p", "-t", self.name]
        if history:
            args += ["-S", f"-{int(history)}"]
        return await self._tmux(*args)

    async def close(self) -> None:
        await self.sandbox.exec(shlex.join(["tmux", "kill-session", "-t", self.name]),
                                timeout_s=self.timeout_s)
