"""rollbank as a Harbor environment provider.

``harbor run --environment-import-path rollbank.integrations.harbor:RollbankEnvironment``
runs every trial's environment in a rollbank sandbox (docs/harbor.md). Harbor (PyPI
``harbor``, Python >= 3.12) is imported only by :mod:`.environment`; this package resolves
``RollbankEnvironment`` lazily so that its pure modules (:mod:`.commands`, :mod:`.plane`) load
without Harbor installed (the unit tests, the 3.11 venv).
"""

from __future__ import annotations

from typing import Any

__all__ = ["RollbankEnvironment"]


def __getattr__(name: str) -> Any:
    if name == "RollbankEnvironment":
        from rollbank.integrations.harbor.environment import RollbankEnvironment

        return RollbankEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
