"""The tokenizer the gateway's chat sessions need, from any served model's tokenizer.

:class:`ChatDecode` wraps a :class:`~rollbank.inference.protocol.Tokenizer` so that
``decode`` takes ``skip_special_tokens`` (``HFTokenizer`` has it; the byte-level fake does not,
and has no special tokens to keep).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ChatDecode:
    """``encode`` as is; ``decode(ids, skip_special_tokens=...)`` whatever the tokenizer takes."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    @property
    def eos_token_id(self) -> int | None:
        value = getattr(self.tok, "eos_token_id", None)
        return value if isinstance(value, int) else None

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        try:
            return str(self.tok.decode(ids, skip_special_tokens=skip_special_tokens))
        except TypeError:  # a tokenizer without the keyword (the byte-level fake)
            return str(self.tok.decode(ids))
