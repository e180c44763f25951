"""Deterministic token ids and log-probs for the accelsim benchmark engine (no model).

Owns :class:`TokenSource`. A token is a hash of (engine seed, weights namespace, prompt,
position) — plus the request id when ``temperature > 0``, so GRPO siblings differ while greedy
requests repeat exactly. Ids fall in ``[0, vocab_size)``; log-probs are finite, in
``[-6, -0.01]`` (greedy ones in ``[-0.5, -0.01]``): plausible for a sampled token, never NaN.
The cost is one 16-byte BLAKE2b per token: the emulator's CPU stays near zero.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence


def _h(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p)
        h.update(b"\x00")
    return h.digest()


class TokenSource:
    """Token ids of one request; ``next(position)`` is a pure function of its key."""

    def __init__(
        self,
        *,
        seed: int,
        namespace: str,
        prompt: Sequence[int],
        vocab_size: int,
        temperature: float,
        request_id: str,
        avoid: frozenset[int] = frozenset(),
    ) -> None:
        prompt_key = _h(struct.pack(f"<{len(prompt)}q", *prompt))
        salt = request_id.encode() if temperature > 0 else b""
        self._key = _h(str(seed).encode(), namespace.encode(), prompt_key, salt)
        self._vocab = vocab_size
        self._greedy = temperature <= 0
        self._avoid = avoid

    def token(self, position: int, *, allow: bool) -> tuple[int, float]:
        """Token id and log-prob at ``position``; ids in ``avoid`` only when ``allow``."""
        d = _h(self._key, struct.pack("<q", position))
        raw, u = struct.unpack("<QQ", d)
        tok = raw % self._vocab
        if not allow and tok in self._avoid and len(self._avoid) < self._vocab:  # min_tokens: EOS / stop ids are not sampled yet
            tok = (tok + 1) % self._vocab
            while tok in self._avoid:
                tok = (tok + 1) % self._vocab
        frac = u / 2**64
        lp = -(0.01 + 0.49 * frac) if self._greedy else -(0.01 + 5.99 * frac * frac)
        return tok, lp
