"""Configuration of the OpenAI-compatible gateway (:class:`GatewaySection`).

The limits are checked before authentication (a request over them never reaches the key
check or a handler); the admin token (``POST /admin/sessions``) is read from the environment
variable ``admin_token_env`` only, never from a flag (it would show in ``ps``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollbank.config import Section

DEFAULT_ADMIN_TOKEN_ENV = "ROLLBANK_GATEWAY_ADMIN_TOKEN"


class GatewaySection(Section):
    """The gateway agents talk to: address, limits, tool-call format, sessions."""

    host: str = Field(default="127.0.0.1", description="address to bind (127.0.0.1 only: the "
                      "gateway speaks plain HTTP and its keys are bearer tokens)")
    port: int = Field(default=0, ge=0, le=65535,
                      description="TCP port to bind (0: any free port; the URL is printed)")
    served_model: str = Field(default="", description="the model name /v1/models lists "
                              "(empty: the inference model's name)")
    tool_parser: Literal["hermes", "llama3_json", "pythonic"] = Field(
        default="hermes", description="the model's tool-call format (rollbank.chat.tool_parsers)")
    tools_in_system_prompt: Literal["auto", "always", "never"] = Field(
        default="auto", description="describe the request's tools in the system message "
        "(Hermes style) when the chat template has no tools slot (auto), always, or never")
    max_header_bytes: int = Field(default=16_384, ge=1024, le=1_048_576,
                                  description="largest request head (request line + headers) "
                                  "accepted; larger: 431, before authentication")
    max_body_bytes: int = Field(default=4_194_304, ge=1024, le=268_435_456,
                                description="largest request body accepted; larger: 413, "
                                "before authentication")
    max_messages: int = Field(default=2048, ge=1, description="most messages one chat request may carry")
    max_json_depth: int = Field(default=64, ge=4, le=1000,
                                description="deepest JSON nesting a request body may have")
    default_max_tokens: int = Field(default=512, ge=1, description="completion tokens when a "
                                    "request names no max_tokens")
    max_tokens_cap: int = Field(default=8192, ge=1, description="largest max_tokens a request "
                                "may ask for (larger: 400 naming the field)")
    sessions: int = Field(default=0, ge=0, le=10_000, description="serve-gateway: open this "
                          "many sessions at start and print their base URL and key (for your "
                          "own agent; more with POST /admin/sessions)")
    admin_token_env: str = Field(default=DEFAULT_ADMIN_TOKEN_ENV,
                                 description="environment variable holding the admin token "
                                 "that guards POST /admin/sessions (unset: the route is off)")
    records_dir: str | None = Field(default=None, description="serve-gateway: write each "
                                    "closed session's record as JSON here (and all open ones "
                                    "at exit)")
