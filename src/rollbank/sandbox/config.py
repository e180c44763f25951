"""Configuration of the sandbox plane shared by every backend (the warm pool); each backend's
own settings live in its folder's ``config.py``."""

from __future__ import annotations

from pydantic import Field

from rollbank.config import Section


class WarmPoolConfig(Section):
    """Sizing of the warm pool."""

    prestart: int = Field(
        default=0, ge=0, le=256,
        description="Sandboxes kept started per key, ready to hand out (0: fork on demand; "
        "forking from a snapshot is already fast with the local backend).",
    )
    budget_s: float | None = Field(
        default=None, gt=0,
        description="Per-episode exec budget of pre-started sandboxes; fork() callers asking "
        "for another budget get freshly forked sandboxes.",
    )
    max_refills: int = Field(
        default=2, ge=1, le=64, description="Refills (background forks) running at once."
    )
