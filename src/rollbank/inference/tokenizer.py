"""The served model's tokenizer, loaded from its ``tokenizer.json`` with ``tokenizers``.

Owns :class:`HFTokenizer` and :func:`load_tokenizer`. Loading does not import transformers
(fast, no network). ``encode`` never adds special tokens: the conversation layer decides
where BOS goes, so a prompt's ids are exactly what it appended. ``decode`` keeps special
tokens out of the text unless asked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbank.errors import ConfigError


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class HFTokenizer:
    """:class:`~rollbank.inference.protocol.Tokenizer` over a Hugging Face ``tokenizer.json``."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ConfigError("model folder has no tokenizer.json", file=model_dir, field="model")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise ConfigError(f"cannot load tokenizer: {exc}", file=path) from exc
        self.model_dir = model_dir
        self._bos = self._special(model_dir, "bos")
        self._eos = self._special(model_dir, "eos")

    def _special(self, model_dir: Path, kind: str) -> int | None:
        tc = model_dir / "tokenizer_config.json"
        if tc.is_file():
            text = _token_text(json.loads(tc.read_text()).get(f"{kind}_token"))
            if text is not None and (tid := self._tok.token_to_id(text)) is not None:
                return int(tid)
        cfg = model_dir / "config.json"
        if cfg.is_file():
            value = json.loads(cfg.read_text()).get(f"{kind}_token_id")
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, int):
                return value
        return None

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        tid = self._tok.token_to_id(token)
        return None if tid is None else int(tid)

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_id(self) -> int | None:
        return self._eos


def load_tokenizer(model_dir: Path) -> HFTokenizer:
    """The tokenizer of a model folder returned by :func:`~rollbank.inference.models.ensure_model`."""
    return HFTokenizer(Path(model_dir))
