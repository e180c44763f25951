"""Configuration of the tasks layer (how environments are built)."""

from __future__ import annotations

from pydantic import Field

from rollbank.config import Section


class BuilderConfig(Section):
    """How environments are built."""

    network: bool = Field(default=True, description="Let RUN steps reach the network (package registries).")
    cache_root: str | None = Field(default=None, description="Where layers are cached (default <ROLLBANK_CACHE>/layers).")
