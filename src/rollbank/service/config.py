"""Configuration of ``rollbank serve-collector``: ``rollbank collect``'s configuration plus a
``[service]`` table (:class:`ServiceSection`), and where the bearer token comes from.

The token is never written into ``config.resolved.json`` (``SecretStr`` dumps as stars) and
is read from, in order: ``service.token`` (config or flag: visible in ``ps`` when given as a
flag), ``service.token_file`` (a file holding it), the environment variable named by
``service.token_env``. The service refuses to start without one (:class:`ConfigError`, exit 3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr

from rollbank.collect_config import CollectConfig, default_config_text, drop_embedded_selection
from rollbank.config import Origins, Section, apply_overrides, read_toml, validate
from rollbank.errors import ConfigError

MIN_TOKEN_CHARS = 16
DEFAULT_TOKEN_ENV = "ROLLBANK_SERVICE_TOKEN"


class ServiceSection(Section):
    """The HTTP service a trainer drives: address, bearer token, batch leases."""

    host: str = Field(
        default="127.0.0.1", description="address to bind (127.0.0.1: this machine only; "
        "0.0.0.0 exposes the service to the network, protected by the token alone: plain HTTP)",
    )
    port: int = Field(default=8765, ge=0, le=65535,
                      description="TCP port to bind (0: any free port; the bound URL is printed "
                      "and written to <output>/service.json)")
    token: SecretStr | None = Field(
        default=None, description="the bearer token itself (prefer token_file or the environment "
        "variable: a command-line flag is visible to other users in `ps`)",
    )
    token_file: str | None = Field(
        default=None, description="a file whose content (stripped) is the bearer token",
    )
    token_env: str = Field(
        default=DEFAULT_TOKEN_ENV, description="environment variable holding the bearer token "
        "(read when neither token nor token_file is set)",
    )
    lease_s: float = Field(
        default=600.0, gt=0, description="seconds a fetched batch stays leased to the trainer; "
        "a batch not acknowledged by then is offered again (to the next fetch)",
    )
    max_unacked_batches: int = Field(
        default=2, ge=1, description="back-pressure: collection pauses before handing over a new "
        "batch while this many written batches are not acknowledged (attempts in flight go on)",
    )
    max_poll_s: float = Field(
        default=60.0, gt=0, description="longest long poll a fetch may ask for (seconds)",
    )
    inflight: Literal["finish", "abort"] = Field(
        default="finish", description="what running requests do when an announced checkpoint is "
        "hot-loaded: 'finish' (drain, then swap) or 'abort' (abort; the slot is re-run)",
    )
    exit_when_done: bool = Field(
        default=True, description="exit (0) once the collection has finished and every batch is "
        "acknowledged; false: keep serving status until SIGINT/SIGTERM (GET /v1/status says "
        "which batches it still waits for in 'ends')",
    )
    max_header_bytes: int = Field(
        default=16 * 1024, ge=1024, le=1 << 20, description="largest request line + headers the "
        "HTTP parser buffers, before authentication (larger: 431/400, connection closed)",
    )
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="largest request body, refused with 413 before "
        "authentication (the routes take small JSON)",
    )


class ServeCollectorConfig(CollectConfig):
    """``rollbank serve-collector``: a collection (as ``rollbank collect`` takes it) served over HTTP."""

    service: ServiceSection = Field(
        default_factory=lambda: ServiceSection.model_validate({}),
        description="the HTTP service (address, token, leases)",
    )


def load_service_config(path: Path | None = None, overrides: dict[str, Any] | None = None,
                        origins: Origins | None = None) -> ServeCollectorConfig:
    """The embedded collect default, or ``path`` (a collect TOML with an optional
    ``[service]`` table); then dotted ``overrides``."""
    data, source = read_toml(path, default_text=default_config_text(), default_name="collect.toml")
    if path is None:
        data = drop_embedded_selection(data, overrides or {})
    data = apply_overrides(data, overrides or {}, origins)
    return validate(ServeCollectorConfig, data, source=source, overrides=overrides, origins=origins)


def resolve_token(cfg: ServiceSection, environ: dict[str, str] | None = None) -> str:
    """The bearer token (see the module doc); :class:`ConfigError` if there is none or it is
    shorter than :data:`MIN_TOKEN_CHARS` characters."""
    env = os.environ if environ is None else environ
    if cfg.token is not None:
        token, where, fld = cfg.token.get_secret_value(), "service.token", "service.token"
    elif cfg.token_file is not None:
        try:
            token = Path(cfg.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"unreadable token file ({exc.strerror})", file=cfg.token_file,
                              field="service.token_file") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"the token file is not UTF-8 text (byte {exc.start})",
                              file=cfg.token_file, field="service.token_file") from exc
        where, fld = f"the token file {cfg.token_file}", "service.token_file"
    else:
        token, where, fld = env.get(cfg.token_env, "").strip(), f"${cfg.token_env}", "service.token_env"
        if not token:
            raise ConfigError(
                f"the service needs a bearer token and none is set: export {cfg.token_env}=<token> "
                f"(e.g. `openssl rand -hex 32`), or set service.token_file", field=fld)
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"the bearer token from {where} has {len(token)} characters; use at "
                          f"least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)", field=fld)
    return token
