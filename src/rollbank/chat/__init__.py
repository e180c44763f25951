"""Chat models: their own chat templates, token-exact chat sessions, tool calls, tool schemas.

- :mod:`rollbank.chat.template`: :class:`~rollbank.chat.template.ChatTemplate`, the model's
  own Jinja template rendered the way transformers renders it, and the prefix-stability probe.
- :mod:`rollbank.chat.session`: :class:`~rollbank.chat.session.ChatSession`, one conversation
  as token ids (model ids exactly as sampled, template deltas for new messages, explicit
  segments where a template rewrites earlier turns).
- :mod:`rollbank.chat.tool_parsers`: tool calls in the model's own format (Hermes/Qwen,
  Llama-3 JSON, pythonic), lenient and never raising.
- :mod:`rollbank.chat.tools`: the tools as OpenAI function schemas.

The package ``__init__`` imports nothing (configuration loading stays light).
"""
