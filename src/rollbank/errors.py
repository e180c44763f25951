"""Typed errors, one family per boundary.

The episode layer maps these to outcomes: anything raised by the host side of a boundary
(inference server, sandbox runtime, verifier harness) is an infrastructure failure; bad input
(task files, config) is reported to the operator with the file and field it concerns and never
reaches a trainer. A failed episode is data, not a crash: runners catch these and record them.
"""

from __future__ import annotations

from pathlib import Path


class RollbankError(Exception):
    """Base of every error rollbank raises on purpose.

    ``exit_code`` is what the command line returns when this error ends a command (see
    docs/architecture.md, "Exit codes"): 1 the run failed, 2 usage, 3 bad input.
    """

    exit_code = 1


class UsageError(RollbankError):
    """The command line itself is wrong (unknown flag, malformed ``--set``)."""

    exit_code = 2


# ---------------------------------------------------------------- input: tasks and config
class InputError(RollbankError):
    """Bad operator input. Always names where: a file, and a field or line when known."""

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        file: Path | str | None = None,
        field: str | None = None,
        line: int | None = None,
    ) -> None:
        self.file = str(file) if file is not None else None
        self.field = field
        self.line = line
        where = []
        if self.file is not None:
            where.append(self.file + (f":{line}" if line is not None else ""))
        if field is not None:
            where.append(f"field {field!r}")
        prefix = f"{' '.join(where)}: " if where else ""
        super().__init__(prefix + message)
        self.message = message


class TaskError(InputError):
    """A task folder is malformed (missing files, bad TOML/YAML, escaping paths...)."""


class BuildError(InputError):
    """An environment could not be built (unsupported Dockerfile instruction, failing RUN...)."""


class ConfigError(InputError):
    """A configuration file or value is invalid."""


class EngineVersionError(ConfigError):
    """The installed vLLM is outside the range whose internals rollbank touches (private
    attributes, plugin registries): the message names the installed version, the supported
    range and the missing symbol if any (``rollbank.inference.vllm_internals``)."""


# ---------------------------------------------------------------- sandbox boundary (infra)
class SandboxError(RollbankError):
    """The sandbox runtime failed (not the model). Maps to infra_failure."""


class IsolationUnavailableError(SandboxError):
    """This machine cannot isolate model commands (no bubblewrap, no namespaces, no overlayfs)."""


class SandboxStartError(SandboxError):
    """A sandbox could not be started."""


class SandboxDiedError(SandboxError):
    """A sandbox's runtime disappeared without a cause attributable to the model."""


class SandboxLostError(SandboxDiedError):
    """The node (or the Ray actor) hosting a sandbox was lost: never the model's doing."""


# ---------------------------------------------------------------- inference boundary (infra)
class InferenceError(RollbankError):
    """An inference server request failed. Maps to infra_failure unless stated otherwise."""

    def __init__(self, message: str, *, server: str | None = None, request_id: str | None = None):
        self.server = server
        self.request_id = request_id
        super().__init__(message)


class ServerUnreachableError(InferenceError):
    """Connection refused / reset / DNS: the server is not there."""


class InferenceTimeoutError(InferenceError):
    """The server did not answer in time."""


class ServerOverloadedError(InferenceError):
    """HTTP 429/503: the server refuses more work right now (safe to retry elsewhere)."""


class BadRequestError(InferenceError):
    """HTTP 400/422: the request itself is wrong (e.g. prompt longer than the context)."""


class RouteMissingError(BadRequestError):
    """HTTP 404: no such route or resource on the server (a plain ``vllm serve`` lacks the
    dev-mode routes: ``/reset_prefix_cache``, ``/weight_info``, weight reloads)."""


class EngineDeadError(InferenceError):
    """The engine behind the server died (HTTP 500 with a dead EngineCore); restart needed."""


class WeightVersionError(InferenceError):
    """The engine did not say which weight version produced a request's tokens (or said
    something rollbank cannot map to its integer versions): the tokens cannot be tagged."""


class PublicationError(InferenceError):
    """A weight publication did not complete. ``serving`` maps each engine to the version it
    serves afterwards (one consistent version unless ``consistent`` is False, e.g. an engine
    died); ``record`` is the publication's measurement record when there is one."""

    def __init__(
        self, message: str, *, serving: dict[str, int] | None = None, record: object | None = None
    ) -> None:
        self.serving = dict(serving or {})
        self.record = record
        super().__init__(message)

    @property
    def consistent(self) -> bool:
        return len(set(self.serving.values())) <= 1


class WeightMismatchError(PublicationError):
    """The published tensors do not match the served model (unknown name, wrong shape or
    dtype): refused before any engine was paused, so every engine keeps its version."""


class InvalidLogprobError(InferenceError):
    """A generated token came back with a missing or non-finite behaviour log-prob."""

    def __init__(
        self, message: str, *, position: int, server: str | None = None, request_id: str | None = None
    ):
        self.position = position
        super().__init__(message, server=server, request_id=request_id)


# A verifier's own failures (crash, timeout, no reward) are data, not exceptions: they come back
# in the verdict (``episodes.attribution.VerifierVerdict.error``) and attribution decides them.


# ---------------------------------------------------------------- orchestration (bugs, not episodes)
class SchedulingError(RollbankError):
    """The collection orchestrator cannot go on: a broken accounting invariant or a run that
    cannot progress. Never an episode failure; it stops the run."""


class CollectionStalledError(SchedulingError):
    """Nothing runs and nothing can be launched, yet the run wants more batches."""


# ---------------------------------------------------------------- the collector service (service/)
class ServiceError(RollbankError):
    """The collector service refused a request or cannot serve one. ``status`` is the HTTP
    status the service answers with (and that :mod:`rollbank.service.client` raises it with):
    401 bad token, 404 unknown batch, 409 stale lease or version, 422 bad request, 503 not ready."""

    def __init__(self, message: str, *, status: int = 500) -> None:
        self.status = status
        super().__init__(message)


class GatewayError(ServiceError):
    """The OpenAI-compatible gateway (``gateway/``) refuses a request: answered with an
    OpenAI-style error body. ``param`` names the offending field (``messages[2].role``),
    ``kind`` is the body's ``type`` (``invalid_request_error``, ``authentication_error``...)."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        self.param = param
        self.kind = kind
        self.code = code
        super().__init__(message, status=status)


def rollbank_error_in(exc: BaseException) -> RollbankError | None:
    """The :class:`RollbankError` ``exc`` is, or the first one an exception group holds when
    every error in it is one (a ``TaskGroup`` wraps the error that ended it); else None."""
    if isinstance(exc, RollbankError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        match, rest = exc.split(RollbankError)
        if match is not None and rest is None:
            leaf: BaseException = match
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf if isinstance(leaf, RollbankError) else None
    return None
