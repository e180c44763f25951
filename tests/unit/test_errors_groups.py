"""rollbank_error_in: the typed error inside a TaskGroup's exception group."""

from __future__ import annotations

from rollbank.errors import BuildError, RollbankError, SandboxError, rollbank_error_in


def test_the_error_itself_and_the_one_a_group_wraps() -> None:
    build = BuildError("exited with 3", file="Dockerfile", line=3)
    assert rollbank_error_in(build) is build
    assert rollbank_error_in(ExceptionGroup("tg", [build])) is build
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [build]), SandboxError("x")])
    assert rollbank_error_in(nested) is build
    assert isinstance(rollbank_error_in(ExceptionGroup("tg", [SandboxError("y")])), RollbankError)


def test_a_group_with_anything_else_is_not_hidden() -> None:
    assert rollbank_error_in(ExceptionGroup("tg", [BuildError("b"), TypeError("bug")])) is None
    assert rollbank_error_in(ValueError("v")) is None
