"""Local sandbox backend: bubblewrap + overlayfs + cgroups + rlimits (see ``backend``)."""

from rollbank.sandbox.local.backend import LocalBackend, check_isolation
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.local.snapshot import LocalSnapshot
from rollbank.sandbox.local.terminal import TmuxTerminal

__all__ = ["LocalBackend", "LocalSandbox", "LocalSandboxConfig", "LocalSnapshot", "TmuxTerminal", "check_isolation"]
