"""A model's own chat template, rendered the way transformers renders it.

Owns :class:`ChatTemplate` (the Jinja source from a model folder's ``tokenizer_config.json``
``chat_template`` / ``chat_template.jinja``, or a GGUF's ``tokenizer.chat_template``), and
:func:`prefix_stable`, the probe that says whether a template only ever appends.

Rendering goes through transformers' own ``render_jinja_template`` (what
``apply_chat_template(..., tokenize=False)`` calls) when transformers is importable, with the
tokenizer's special-token strings as template variables; otherwise through a jinja2 sandbox
configured like transformers' (``trim_blocks``, ``lstrip_blocks``, ``tojson``,
``raise_exception``). Nothing here re-types a template.

Invariants
- ``render`` is a pure function of (messages, tools, add_generation_prompt): the same inputs
  give the same text, so a session can compare renderings to find deltas.
- A template error (``raise_exception`` in the template, a Jinja error) is a
  :class:`~rollbank.errors.ConfigError` naming the template, never a bare Jinja exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from rollbank.errors import ConfigError

Message = Mapping[str, Any]


def _raise(message: str) -> None:
    raise ValueError(message)


@lru_cache(maxsize=32)
def _jinja(source: str) -> Any:
    """The fallback renderer: a jinja2 sandbox configured as transformers configures it."""
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[ext.loopcontrols])

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _transformers_render() -> Any:
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except Exception:  # transformers missing or changed: the equivalent jinja2 sandbox
        return None
    return render_jinja_template


@dataclass(frozen=True)
class ChatTemplate:
    """One model's chat template and the special-token strings it may refer to."""

    source: str
    name: str = ""
    bos_token: str = ""
    eos_token: str = ""
    use_transformers: bool = True

    # ------------------------------------------------------------------ building
    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ChatTemplate:
        """The template of a Hugging Face model folder (tokenizer_config.json or
        chat_template.jinja, as transformers saves either)."""
        d = Path(model_dir)
        cfg_path = d / "tokenizer_config.json"
        cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        source = cfg.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
        if not isinstance(source, str) and (d / "chat_template.jinja").is_file():
            source = (d / "chat_template.jinja").read_text()
        if not isinstance(source, str) or not source.strip():
            raise ConfigError("model has no chat template (tokenizer_config.json chat_template)",
                              file=cfg_path, field="model")
        return cls(source, name=d.name, bos_token=_token_text(cfg.get("bos_token")),
                   eos_token=_token_text(cfg.get("eos_token")))

    @classmethod
    def from_gguf(cls, path: str | Path) -> ChatTemplate:
        """The template in a GGUF file's metadata (``tokenizer.chat_template``)."""
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        field = reader.fields.get("tokenizer.chat_template")
        if field is None:
            raise ConfigError("GGUF has no tokenizer.chat_template", file=Path(path), field="model")
        source = str(field.contents())
        return cls(source, name=Path(path).stem)

    @classmethod
    def for_model(cls, name_or_dir: str) -> ChatTemplate:
        """The template of a project model (``smollm2-135m-instruct``, ...) or model folder
        (prepared by :func:`~rollbank.inference.models.ensure_model`)."""
        from rollbank.inference.models import ensure_model

        tpl = cls.from_model_dir(ensure_model(name_or_dir))
        return cls(tpl.source, name=name_or_dir, bos_token=tpl.bos_token,
                   eos_token=tpl.eos_token)

    # ------------------------------------------------------------------ reading
    @property
    def supports_tools(self) -> bool:
        """Whether the template has a tools slot (it reads the ``tools`` variable)."""
        return "tools" in self.source

    def render(self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool) -> str:
        """The template's text for ``messages`` (``tokenize=False``)."""
        msgs = [dict(m) for m in messages]
        tool_list = [dict(t) for t in tools] if tools else None
        try:
            fn = _transformers_render() if self.use_transformers else None
            if fn is not None:
                rendered, _ = fn([msgs], tools=tool_list, chat_template=self.source,
                                 add_generation_prompt=add_generation_prompt,
                                 bos_token=self.bos_token, eos_token=self.eos_token)
                return str(rendered[0])
            return str(_jinja(self.source).render(
                messages=msgs, tools=tool_list, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token))
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"chat template {self.name or '?'} failed to render: "
                              f"{type(exc).__name__}: {exc}", field="model") from exc


def _token_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return ""


# ---------------------------------------------------------------------- the probe
@dataclass(frozen=True)
class PrefixReport:
    """Whether each rendering of the first k messages is a prefix of the first k+1's."""

    stable: bool
    checked: int  # how many k were compared
    first_break: int | None = None  # the first k whose rendering was rewritten by message k+1
    before: str = ""  # the rendering of k messages (the part that changed)
    after: str = ""  # the rendering of k+1 messages at the same place

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


PROBE_CONVERSATION: tuple[dict[str, Any], ...] = (
    {"role": "system", "content": "You operate a Linux shell."},
    {"role": "user", "content": "Create /app/out.txt containing hello."},
    {"role": "assistant", "content": "<think>I should write the file.</think>\nI will write it."},
    {"role": "tool", "content": "[exit code 0]", "tool_call_id": "call_0"},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": "Now check it."},
    {"role": "assistant", "content": "<think>cat it</think>\nIt says hello."},
)


def prefix_stable(template: ChatTemplate, messages: Sequence[Message] = PROBE_CONVERSATION, *,
                  tools: Sequence[Mapping[str, Any]] | None = None) -> PrefixReport:
    """Probe: for every k, is render(first k, generation prompt if message k+1 is the
    model's) a prefix of render(first k+1)? A template that drops past reasoning or
    re-renders earlier turns is not, and a token-exact session must start a new segment."""
    checked = 0
    for k in range(1, len(messages)):
        gen = messages[k].get("role") == "assistant"
        a = template.render(messages[:k], tools=tools, add_generation_prompt=gen)
        b = template.render(messages[: k + 1], tools=tools, add_generation_prompt=False)
        checked += 1
        if not b.startswith(a):
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return PrefixReport(False, checked, k, a[at:at + 120], b[at:at + 120])
    return PrefixReport(True, checked)
