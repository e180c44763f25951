"""Dockerfile parsing without a Docker engine.

Owns: turning a Dockerfile into a list of :class:`Instruction` (one per logical line, with the
1-based line it starts on) and Docker's variable substitution. It does no I/O beyond reading
the file and executes nothing; :mod:`rollbank.tasks.builder` interprets the instructions.

Accepted syntax
- line continuations (``\\`` at end of line), comments and blank lines inside continuations,
  the ``# syntax=`` parser directive (ignored) — any other ``escape=`` than ``\\`` is an error;
- exec form (JSON array) and shell form for RUN/CMD/ENTRYPOINT/SHELL;
- here-documents (``RUN <<EOF`` ... ``EOF``, ``COPY <<EOF /path``), ``<<-`` and quoted
  delimiters included;
- ``ARG name[=default]`` and ``ENV k=v ...`` / legacy ``ENV k v``; ``$VAR``, ``${VAR}``,
  ``${VAR:-default}`` and ``${VAR:+alt}`` substitution in every instruction but RUN/CMD/
  ENTRYPOINT (there the shell expands, with ARG and ENV values in its environment).

Invariants
- Every error is a :class:`~rollbank.errors.BuildError` naming the file and line.
- Supported instructions: FROM (``AS name`` allowed; stages are the builder's), RUN, COPY, ADD, WORKDIR, ENV,
  ARG, USER, SHELL; recorded only: LABEL, EXPOSE, CMD, ENTRYPOINT, STOPSIGNAL, HEALTHCHECK,
  VOLUME, MAINTAINER, ONBUILD (no effect on the filesystem, noted). Anything else is an error.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rollbank.errors import BuildError

FILESYSTEM = frozenset({"RUN", "COPY", "ADD", "WORKDIR"})
STATE = frozenset({"FROM", "ENV", "ARG", "USER", "SHELL"})
RECORDED = frozenset({"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "STOPSIGNAL", "HEALTHCHECK",
                      "VOLUME", "MAINTAINER", "ONBUILD"})
KNOWN = FILESYSTEM | STATE | RECORDED
MAX_DOCKERFILE_BYTES = 1024 * 1024

_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_VAR = re.compile(r"\\\$|\$(?:\{(?P<b>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<op>[-+])(?P<w>[^}]*))?\}"
                  r"|(?P<n>[A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Heredoc:
    """A here-document attached to an instruction: delimiter, body, whether it expands."""

    name: str
    body: str
    expand: bool


@dataclass(frozen=True)
class Instruction:
    """One logical Dockerfile instruction.

    ``args`` is the raw text after the keyword (continuations joined, flags included);
    ``flags`` the leading ``--name=value`` options; ``rest`` the text after them.
    """

    keyword: str
    args: str
    line: int
    flags: tuple[tuple[str, str], ...] = ()
    rest: str = ""
    heredocs: tuple[Heredoc, ...] = field(default=())

    def exec_form(self) -> list[str] | None:
        """The JSON exec form of ``rest`` (``["a", "b"]``), or None for shell form."""
        text = self.rest.strip()
        if not text.startswith("["):
            return None
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        return None


def parse_file(path: Path) -> list[Instruction]:
    """Parse a Dockerfile from disk."""
    try:
        size = path.stat().st_size
        if size > MAX_DOCKERFILE_BYTES:
            raise BuildError(f"Dockerfile is {size} bytes (limit {MAX_DOCKERFILE_BYTES})", file=path)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise BuildError("Dockerfile not found", file=path) from exc
    except UnicodeDecodeError as exc:
        raise BuildError(f"Dockerfile is not UTF-8: {exc}", file=path) from exc
    return parse(text, file=path)


def parse(text: str, *, file: Path | str = "Dockerfile") -> list[Instruction]:
    """Parse Dockerfile text into instructions; errors name ``file`` and the line."""
    lines = text.splitlines()
    out: list[Instruction] = []
    i = 0
    directives_open = True
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            if directives_open and stripped.startswith("#"):
                m = re.match(r"#\s*([a-zA-Z]+)\s*=\s*(\S+)", stripped)
                if m and m.group(1).lower() == "escape" and m.group(2) != "\\":
                    raise BuildError(f"escape directive {m.group(2)!r} is not supported",
                                     file=file, line=i + 1)
                if not m:
                    directives_open = False
            i += 1
            continue
        directives_open = False
        start = i
        parts: list[str] = []
        while True:
            cur = lines[i]
            if cur.rstrip().endswith("\\"):
                parts.append(cur.rstrip()[:-1])
                i += 1
                # comment and blank lines inside a continuation are dropped
                while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                    i += 1
                if i >= len(lines):
                    break
                continue
            parts.append(cur)
            i += 1
            break
        logical = " ".join(p.strip() for p in parts if p.strip())
        keyword, _, args = logical.partition(" ")
        keyword = keyword.upper()
        if not re.fullmatch(r"[A-Z]+", keyword):
            raise BuildError(f"cannot parse instruction {logical[:60]!r}", file=file, line=start + 1)
        heredocs: list[Heredoc] = []
        if keyword in ("RUN", "COPY", "ADD"):
            for m in _HEREDOC.finditer(args):
                strip_tabs, quote, name = m.group(1), m.group(2), m.group(3)
                body: list[str] = []
                while i < len(lines) and lines[i].rstrip("\r") != name and not (
                        strip_tabs and lines[i].lstrip("\t").rstrip("\r") == name):
                    body.append(lines[i].lstrip("\t") if strip_tabs else lines[i])
                    i += 1
                if i >= len(lines):
                    raise BuildError(f"here-document <<{name} is not terminated",
                                     file=file, line=start + 1)
                i += 1
                heredocs.append(Heredoc(name, "\n".join(body) + "\n", expand=not quote))
        if keyword not in KNOWN:
            raise BuildError(f"unsupported instruction {keyword}", file=file, line=start + 1)
        flags, rest = _split_flags(args)
        out.append(Instruction(keyword, args.strip(), start + 1, flags, rest, tuple(heredocs)))
    return out


def _split_flags(args: str) -> tuple[tuple[tuple[str, str], ...], str]:
    flags: list[tuple[str, str]] = []
    rest = args.strip()
    while rest.startswith("--"):
        token, _, after = rest.partition(" ")
        name, _, value = token[2:].partition("=")
        flags.append((name, value))
        rest = after.strip()
    return tuple(flags), rest


def substitute(text: str, env: Mapping[str, str]) -> str:
    """Docker's variable substitution (``$X``, ``${X}``, ``${X:-d}``, ``${X:+a}``, ``\\$``)."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "\\$":
            return "$"
        name = m.group("b") or m.group("n")
        value = env.get(name)
        op = m.group("op")
        if op == "-":
            return value if value else substitute(m.group("w"), env)
        if op == "+":
            return substitute(m.group("w"), env) if value else ""
        return value or ""

    return _VAR.sub(repl, text)


def parse_key_values(text: str, *, keyword: str, file: Path | str, line: int) -> list[tuple[str, str]]:
    """``ENV``/``LABEL``/``ARG`` arguments: ``k=v k2="v 2"`` or the legacy ``ENV k v`` form."""
    try:
        words = shlex.split(text, posix=True)
    except ValueError as exc:
        raise BuildError(f"{keyword}: {exc}", file=file, line=line) from exc
    if not words:
        raise BuildError(f"{keyword} needs arguments", file=file, line=line)
    if "=" not in words[0]:
        if keyword == "ARG":
            return [(words[0], "")] if len(words) == 1 else _bad(keyword, file, line)
        if keyword == "ENV":
            name, _, value = text.strip().partition(" ")
            if not value.strip():
                raise BuildError("ENV needs a value", file=file, line=line)
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            return [(name, value)]
        return _bad(keyword, file, line)
    pairs = []
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name:
            return _bad(keyword, file, line)
        pairs.append((name, value))
    return pairs


def _bad(keyword: str, file: Path | str, line: int) -> list[tuple[str, str]]:
    raise BuildError(f"{keyword}: expected name=value pairs", file=file, line=line)


def split_words(text: str, *, keyword: str, file: Path | str, line: int) -> list[str]:
    """Arguments of COPY/ADD (JSON array or whitespace separated)."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise BuildError(f"{keyword}: invalid JSON array: {exc}", file=file, line=line) from exc
        except RecursionError as exc:
            raise BuildError(f"{keyword}: JSON array nested too deeply", file=file, line=line) from exc
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise BuildError(f"{keyword}: expected a JSON array of strings", file=file, line=line)
        return list(value)
    try:
        return shlex.split(stripped)
    except ValueError as exc:
        raise BuildError(f"{keyword}: {exc}", file=file, line=line) from exc
