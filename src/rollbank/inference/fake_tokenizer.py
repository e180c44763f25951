"""Byte-level fake tokenizer (implements :class:`~rollbank.inference.protocol.Tokenizer`).

Re-exported by :mod:`rollbank.inference.fake`; ids 0..255 are UTF-8 bytes, so any text
round-trips exactly (invalid byte sequences decode with replacement characters).
"""

from __future__ import annotations

from collections.abc import Sequence


class FakeTokenizer:
    """Byte-level tokenizer: ids 0..255 are UTF-8 bytes, 256 is BOS, 257 is EOS."""

    BOS = 256
    EOS = 257
    vocab_size = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    @property
    def bos_token_id(self) -> int | None:
        return self.BOS

    @property
    def eos_token_id(self) -> int | None:
        return self.EOS
