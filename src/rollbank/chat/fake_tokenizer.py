"""A byte-level fake tokenizer that knows a chat template's special tokens.

:class:`SpecialTokenizer`: ids 0..255 are UTF-8 bytes, 256 BOS, 257 EOS (as
:class:`~rollbank.inference.fake_tokenizer.FakeTokenizer`), and each given special string
(``<|im_end|>``, ``<end_of_turn>``, ...) is one id from 258 on, matched in text the way a real
tokenizer matches its added tokens. ``decode`` drops special tokens unless asked to keep them,
like ``HFTokenizer``. Unit tests of chat sessions use it with small Jinja templates.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rollbank.inference.fake_tokenizer import FakeTokenizer


class SpecialTokenizer(FakeTokenizer):
    """A :class:`FakeTokenizer` (so a fake inference server can sample with it) whose BOS,
    EOS and ``specials`` are whole tokens."""

    def __init__(self, specials: Sequence[str] = (), *, bos: str = "<s>", eos: str = "</s>") -> None:
        names = [bos, eos, *[s for s in specials if s not in (bos, eos)]]
        self._ids = {s: 256 + i for i, s in enumerate(names)}
        self._text = {i: s for s, i in self._ids.items()}
        self.bos_text, self.eos_text = bos, eos
        alts = sorted(self._ids, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in alts) + ")")
        self.vocab_size = 256 + len(self._ids)

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self._ids:
                ids.append(self._ids[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        out: list[str] = []
        buf = bytearray()
        for t in token_ids:
            if 0 <= t < 256:
                buf.append(t)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            if not skip_special_tokens and t in self._text:
                out.append(self._text[t])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)
