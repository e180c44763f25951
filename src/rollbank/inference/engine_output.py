"""What an engine says about each generated token, checked before it reaches a trajectory.

Owns the mapping between rollbank's integer weight versions and the engine's version labels,
the expansion of the engine's version spans to one version per token, and the check of
behaviour log-probs.

Version labels (engine <-> rollbank)
- rollbank versions are ints >= 0. A publication names its version on the engine as the
  decimal string ``str(version)`` (``/update_weight_version``, SGLang ``weight_version``).
- An engine that was never told a version reports vLLM's initial label ``"default"``: that
  is version 0 (the weights the server was started with).
- Any other label (``"v7"``, ``"-1"``, ``"abc"``) was set by someone else: rollbank cannot
  order it, so it refuses to tag the tokens (:class:`WeightVersionError`).

Log-probs
- A missing (``None``), non-finite (NaN, +-inf) or sentinel (``<= -9999``: vLLM's scale-out
  endpoint clamps a missing, -inf or NaN log-prob to ``-9999.0``) log-prob for a generated
  token is an :class:`InvalidLogprobError` (an inference error, so the attempt is an infra
  failure) naming the request id and the token position; it never becomes a number in a batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rollbank.errors import InvalidLogprobError, WeightVersionError

DEFAULT_LABEL = "default"  # vLLM's label before anyone sets a version
LOGPROB_SENTINEL = -9999.0  # vLLM scale-out: missing / -inf / NaN log-probs are clamped to this


def version_label(version: int) -> str:
    """The label rollbank installs on an engine for ``version``."""
    if version < 0:
        raise ValueError(f"weight versions are >= 0, got {version}")
    return str(version)


def parse_version_label(label: object, *, server: str | None = None, request_id: str | None = None) -> int:
    """The integer version an engine label stands for (see the module docstring)."""
    if label == DEFAULT_LABEL:
        return 0
    if isinstance(label, str) and label.isascii() and label.isdigit():
        return int(label)
    raise WeightVersionError(
        f"engine weight version {label!r} is not one rollbank published (expected 'default' or a "
        "decimal integer); refusing to tag tokens with it",
        server=server,
        request_id=request_id,
    )


def versions_from_spans(
    spans: Sequence[Mapping[str, Any]] | None,
    num_tokens: int,
    *,
    server: str | None = None,
    request_id: str | None = None,
) -> list[int]:
    """One version per output token from ``[{"version", "start", "end"}]`` spans.

    The spans must tile ``[0, num_tokens)`` in order; anything else is a
    :class:`WeightVersionError` (the engine's account of the tokens is unusable).
    """
    if not spans:
        if num_tokens == 0:
            return []
        raise WeightVersionError(
            f"request {request_id}: the engine reported no weight_versions for {num_tokens} tokens",
            server=server,
            request_id=request_id,
        )
    out: list[int] = []
    for span in spans:
        start, end = span["start"], span["end"]
        if (isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int)
                or not isinstance(end, int) or start != len(out) or end < start or end > num_tokens):
            raise WeightVersionError(
                f"request {request_id}: weight_versions spans {list(spans)} do not tile "
                f"[0, {num_tokens})",
                server=server,
                request_id=request_id,
            )
        out.extend([parse_version_label(span["version"], server=server, request_id=request_id)] * (end - start))
    if len(out) != num_tokens:
        raise WeightVersionError(
            f"request {request_id}: weight_versions cover {len(out)} tokens, the output has {num_tokens}",
            server=server,
            request_id=request_id,
        )
    return out


def checked_logprobs(
    values: Sequence[object], *, server: str | None = None, request_id: str | None = None
) -> list[float]:
    """``values`` as floats, or :class:`InvalidLogprobError` at the first unusable one."""
    out: list[float] = []
    for i, v in enumerate(values):
        try:
            lp = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
        except OverflowError:  # an int too large for a float
            lp = None
        if lp is None or not math.isfinite(lp) or lp <= LOGPROB_SENTINEL:
            raise InvalidLogprobError(
                f"request {request_id}: token position {i} has log-prob {v!r} (missing or not finite)",
                position=i,
                server=server,
                request_id=request_id,
            )
        out.append(lp)
    return out
