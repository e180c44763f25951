"""Dockerfile parsing and substitution (rollbank.tasks.dockerfile): pure, no builds."""

from __future__ import annotations

import pytest

from rollbank.errors import BuildError
from rollbank.tasks import dockerfile as df


def test_continuations_comments_and_lines() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "FROM ubuntu:24.04\n"
        "\n"
        "# a comment\n"
        "RUN apt-get update && \\\n"
        "    # dropped comment inside the continuation\n"
        "\n"
        "    apt-get install -y curl\n"
        "WORKDIR /app\n"
    )
    ins = df.parse(text)
    assert [(i.keyword, i.line) for i in ins] == [("FROM", 2), ("RUN", 5), ("WORKDIR", 9)]
    assert ins[1].rest == "apt-get update && apt-get install -y curl"


def test_exec_and_shell_forms() -> None:
    run_exec, run_shell, bad_json = df.parse(
        'RUN ["/bin/sh", "-c", "echo hi"]\nRUN echo [not json\nCMD [oops\n')
    assert run_exec.exec_form() == ["/bin/sh", "-c", "echo hi"]
    assert run_shell.exec_form() is None
    assert bad_json.exec_form() is None  # Docker treats invalid JSON as shell form


def test_flags_are_split_from_arguments() -> None:
    (ins,) = df.parse("COPY --chown=app:app --chmod=755 src/ /app/\n")
    assert ins.flags == (("chown", "app:app"), ("chmod", "755"))
    assert ins.rest == "src/ /app/"


def test_heredocs_are_collected_with_their_bodies() -> None:
    ins = df.parse("FROM x\nRUN <<EOF\nset -e\necho a\nEOF\nCOPY <<'DOC' /etc/x\n$NOT_EXPANDED\nDOC\nWORKDIR /\n")
    assert [i.keyword for i in ins] == ["FROM", "RUN", "COPY", "WORKDIR"]
    assert ins[1].heredocs[0].body == "set -e\necho a\n"
    assert ins[1].heredocs[0].expand is True
    assert ins[2].heredocs[0].name == "DOC" and ins[2].heredocs[0].expand is False
    assert ins[3].line == 9


def test_unterminated_heredoc_names_the_line() -> None:
    with pytest.raises(BuildError) as err:
        df.parse("FROM x\nRUN <<EOF\necho a\n", file="Dockerfile")
    assert err.value.line == 2 and "not terminated" in str(err.value)


def test_unknown_instruction_names_file_and_line() -> None:
    with pytest.raises(BuildError) as err:
        df.parse("FROM x\n\nFROBNICATE now\n", file="/t/Dockerfile")
    assert err.value.file == "/t/Dockerfile" and err.value.line == 3
    assert "FROBNICATE" in str(err.value)


def test_escape_directive_other_than_backslash_is_refused() -> None:
    with pytest.raises(BuildError):
        df.parse("# escape=`\nFROM x\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$A/b", "1/b"),
        ("${A}x", "1x"),
        ("${MISSING:-fallback}", "fallback"),
        ("${A:-fallback}", "1"),
        ("${A:+alt}", "alt"),
        ("${MISSING:+alt}", ""),
        ("\\$A", "$A"),
        ("$MISSING", ""),
    ],
)
def test_substitution(text: str, expected: str) -> None:
    assert df.substitute(text, {"A": "1"}) == expected


def test_env_both_forms_and_arg_defaults() -> None:
    assert df.parse_key_values('A=1 B="two words"', keyword="ENV", file="D", line=1) == [
        ("A", "1"), ("B", "two words")]
    assert df.parse_key_values("LEGACY some value", keyword="ENV", file="D", line=1) == [
        ("LEGACY", "some value")]
    assert df.parse_key_values("NAME", keyword="ARG", file="D", line=1) == [("NAME", "")]
    assert df.parse_key_values("NAME=x", keyword="ARG", file="D", line=1) == [("NAME", "x")]
    with pytest.raises(BuildError):
        df.parse_key_values("ONLYNAME", keyword="ENV", file="D", line=4)


def test_copy_words_json_and_plain() -> None:
    assert df.split_words('["a b", "/dst/"]', keyword="COPY", file="D", line=1) == ["a b", "/dst/"]
    assert df.split_words("a b /dst/", keyword="COPY", file="D", line=1) == ["a", "b", "/dst/"]
    with pytest.raises(BuildError):
        df.split_words('["a", 1]', keyword="COPY", file="D", line=1)
