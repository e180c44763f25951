"""The session table: one base URL and one key per attempt. Pure (injected clock and
secret source, no I/O).

A session is opened for one attempt (``attempt_id``, ``group_id``) and gets a random
``session_id`` (its URL path, ``/s/<session_id>/v1``) and a random key (the bearer token).
The table keeps only the key's SHA-256, so a key is looked up by digest (no timing on the
secret itself) and never stored in a record.

Invariants
- A key selects exactly one session; a request carrying a session path must carry that
  session's key (otherwise 401: a key of attempt A on attempt B's URL is refused, so a mixed-up
  configuration cannot write into another attempt). An unknown or closed key is 401.
- An attempt has at most one open session; closing returns it once and forgets its key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from rollbank.clock import Clock
from rollbank.errors import GatewayError
from rollbank.gateway.records import RequestRecord
from rollbank.gateway.transcript import ChatTranscript, CompletionTranscript

SlotFactory = Callable[[str], AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class SessionHandle:
    """What an attempt's agent is given: point an OpenAI client at ``base_url`` with ``api_key``."""

    session_id: str
    attempt_id: str
    group_id: str
    model: str
    base_url: str
    api_key: str

    def env(self) -> dict[str, str]:
        """The environment the official clients read (openai, LiteLLM's openai provider)."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key,
                "OPENAI_API_BASE": self.base_url}


@dataclass
class Session:
    session_id: str
    attempt_id: str
    group_id: str
    model: str
    key_digest: bytes
    opened_at: float
    slot: SlotFactory | None = None
    chat: ChatTranscript | None = None
    completion: CompletionTranscript | None = None
    requests: list[RequestRecord] = field(default_factory=list)
    refused: list[RequestRecord] = field(default_factory=list)  # refused before generation
    closed: bool = False

    @property
    def rejected(self) -> int:
        return len(self.refused)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class SessionTable:
    """Open sessions by key digest and by session id (see the module docstring)."""

    def __init__(self, clock: Clock, *, secret: Callable[[int], str] = secrets.token_urlsafe) -> None:
        self.clock = clock
        self._secret = secret
        self._by_digest: dict[bytes, Session] = {}
        self._by_id: dict[str, Session] = {}
        self._by_attempt: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, attempt_id: str, group_id: str, *, model: str,
             slot: SlotFactory | None = None) -> tuple[Session, str]:
        """A new session for ``attempt_id`` and its key (shown once)."""
        if attempt_id in self._by_attempt:
            raise GatewayError(f"attempt {attempt_id!r} already has an open session", status=409,
                               param="attempt_id")
        key = "rb-" + self._secret(32)
        sid = self._secret(12).replace("-", "x").replace("_", "y")
        if _digest(key) in self._by_digest or sid in self._by_id:  # a repeating secret source
            raise GatewayError("session key collision", status=500)
        s = Session(sid, attempt_id, group_id, model, _digest(key), self.clock.now(), slot)
        self._by_digest[s.key_digest] = s
        self._by_id[sid] = s
        self._by_attempt[attempt_id] = s
        return s, key

    def lookup(self, key: str | None, session_id: str | None = None) -> Session:
        """The open session ``key`` selects (and, with ``session_id``, that it names); 401 else."""
        s = self._by_digest.get(_digest(key)) if key else None
        if s is None or s.closed:
            raise GatewayError("unknown or closed session key", status=401,
                               kind="authentication_error", code="invalid_api_key")
        if session_id is not None and not hmac.compare_digest(s.session_id, session_id):
            raise GatewayError("this key belongs to another session's URL", status=401,
                               kind="authentication_error", code="invalid_api_key")
        return s

    def by_id(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def close(self, session_id: str) -> Session:
        s = self._by_id.pop(session_id, None)
        if s is None:
            raise KeyError(f"no open session {session_id!r}")
        s.closed = True
        del self._by_digest[s.key_digest]
        del self._by_attempt[s.attempt_id]
        return s

    def open_sessions(self) -> list[Session]:
        return list(self._by_id.values())
