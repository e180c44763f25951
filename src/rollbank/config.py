"""Configuration conventions.

One pydantic model per component, every field documented (``Field(description=...)``) and
constrained; ``extra="forbid"`` so a typo in a TOML file is an error naming the field. People
write TOML; :func:`load_toml` validates it and :func:`dump_resolved` writes the fully resolved
config beside a run's outputs.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rollbank.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class Section(BaseModel):
    """Base of every config model: strict about unknown keys, immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def cache_dir() -> Path:
    """Where built layers, base filesystems and converted models live (``ROLLBANK_CACHE``)."""
    root = os.environ.get("ROLLBANK_CACHE") or str(Path.home() / ".cache" / "rollbank")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def validate(model: type[M], data: dict[str, Any], *, source: str) -> M:
    """Validate ``data`` against ``model``; errors name the source and the dotted field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise ConfigError(first["msg"], file=source, field=field) from exc


def load_toml(path: Path, model: type[M]) -> M:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError("file not found", file=path) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", file=path) from exc
    return validate(model, data, source=str(path))


def dump_resolved(config: BaseModel, out_dir: Path, name: str = "config.resolved.json") -> Path:
    """Write the resolved config (defaults filled in) beside a run's outputs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / name
    path.write_text(json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    return path
