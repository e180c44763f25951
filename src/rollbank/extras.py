"""Optional dependencies (the package's extras) and the error raised when one is missing.

Bottom layer (imports only :mod:`rollbank.errors`). A module that needs a library from an
extra imports it through :func:`require` at the point of use, so ``import rollbank`` and
everything that does not need the extra work without it, and a missing extra is reported
with the command that installs it instead of a bare ``ModuleNotFoundError``.

Extras (declared in pyproject.toml): ``train`` (torch: the batch loader), ``report``
(matplotlib: report.html), ``vllm`` (managed vLLM servers), ``model`` (Gemma conversion),
``peers`` (peer routers for the routing bench), ``ray``, ``tensorboard`` (tensorboardX),
``wandb``, ``dev``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rollbank.errors import RollbankError


class MissingExtraError(RollbankError, ImportError):
    """A feature needs a library from an extra that is not installed."""

    def __init__(self, module: str, extra: str, feature: str) -> None:
        self.module = module
        self.extra = extra
        self.feature = feature
        super().__init__(
            f"{feature} needs the Python package {module!r}, which is not installed; "
            f"install it with: pip install 'rollbank[{extra}]'"
        )


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or module
        if not (module == missing or module.startswith(missing + ".")):
            raise  # the package is there but one of *its* own imports is broken
        raise MissingExtraError(module, extra, feature) from exc
