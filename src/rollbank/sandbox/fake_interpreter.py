"""The fake sandbox's command interpreter: enough shell for unit tests, over a ``dict`` of files.

* lists: ``a; b``, ``a && b``, ``a || b`` (left to right, no pipes, no subshells);
* words: single/double quotes via :mod:`shlex`; ``$NAME`` / ``${NAME}`` and ``$?`` expanded
  from the environment (not inside single quotes);
* redirections at the end of a command: ``> file``, ``>> file``, ``2> file``, ``< file``;
* builtins: ``echo [-n]``, ``printf FMT ARGS`` (``%s %d \\n \\t``), ``cat [FILE...]``,
  ``ls [DIR]``, ``pwd``, ``cd DIR``, ``mkdir [-p]``, ``rm [-rf]``, ``touch``,
  ``test``/``[`` with ``-f -d -e -n -z``, ``true``, ``false``, ``exit N``, ``export K=V``,
  ``K=V``, ``sleep S`` (delegated to the sandbox: it owns time and deadlines), and any extra
  command given as a handler;
* unknown commands exit 127 with ``sh: NAME: not found``.

Directories are implicit: a path is a directory when some file lies below it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

# (sandbox, args, stdin) -> (exit code, stdout, stderr); the sandbox is the FakeSandbox
Handler = Callable[[Any, list[str], bytes], tuple[int, bytes, bytes]]


@dataclass
class ShellState:
    """What survives between commands of one shell: cwd, variables, ``$?``."""

    cwd: str
    env: dict[str, str]
    status: int = 0


@dataclass
class RunContext:
    """One ``exec``: its deadline (on the sandbox's clock) and collected output."""

    deadline: float | None
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)


class CommandTimeout(Exception):
    """The deadline passed while a command ran (raised by the sandbox's ``sleep``)."""


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class Interpreter:
    """Runs command text against ``files`` (mutated in place)."""

    def __init__(self, files: dict[str, bytes], handlers: Mapping[str, Handler], owner: object,
                 sleep: Callable[[float, RunContext], Awaitable[None]]) -> None:
        self.files = files
        self.handlers = handlers
        self.owner = owner
        self.sleep = sleep

    async def run(self, text: str, st: ShellState, ctx: RunContext, stdin: bytes) -> int:
        """Run a command list; ``st`` carries cwd, variables and ``$?`` across calls."""
        lex = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split = True
        lex.commenters = ""
        tokens = list(lex)
        parts: list[tuple[str, list[str]]] = []  # (connector before, words)
        cur: list[str] = []
        conn = ";"
        for tok in tokens:
            if tok in (";", "&&", "||"):
                parts.append((conn, cur))
                conn, cur = tok, []
            else:
                cur.append(tok)
        parts.append((conn, cur))
        rc = 0
        for conn, words in parts:
            if (conn == "&&" and rc != 0) or (conn == "||" and rc == 0) or not words:
                continue
            try:
                rc = await self._simple(words, st, ctx, stdin)
            except _Exit as ex:
                st.status = ex.code
                return ex.code
            st.status = rc
        return rc

    def _path(self, st: ShellState, p: str) -> str:
        return str(PurePosixPath("/") / st.cwd / p) if not p.startswith("/") else str(PurePosixPath(p))

    def _expand(self, word: str, st: ShellState) -> str:
        def sub(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            return str(st.status) if name == "?" else st.env.get(name, "")
        return re.sub(r"\$\{(\w+)\}|\$(\w+|\?)", sub, word)

    async def _simple(self, words: list[str], st: ShellState, ctx: RunContext, stdin: bytes) -> int:
        words = [self._expand(w, st) for w in words]
        redirs: list[tuple[str, str]] = []
        while len(words) >= 2 and words[-2] in (">", ">>", "<", "2>"):
            redirs.insert(0, (words[-2], words[-1]))
            words = words[:-2]
        if len(words) >= 2 and words[-1] == "2" and redirs and redirs[0][0] == ">":
            words, redirs[0] = words[:-1], ("2>", redirs[0][1])
        for op, target in redirs:
            if op == "<":
                stdin = self.files.get(self._path(st, target), b"")
        out, err = bytearray(), bytearray()
        rc = await self._builtin(words, st, ctx, stdin, out, err)
        sinks = {"1": out, "2": err}
        for op, target in redirs:
            if op in (">", ">>", "2>"):
                key = self._path(st, target)
                data = bytes(sinks["2" if op == "2>" else "1"])
                self.files[key] = (self.files.get(key, b"") if op == ">>" else b"") + data
                sinks["2" if op == "2>" else "1"].clear()
        ctx.out += out
        ctx.err += err
        return rc

    async def _builtin(self, w: list[str], st: ShellState, ctx: RunContext, stdin: bytes,
                       out: bytearray, err: bytearray) -> int:
        name, args = w[0], w[1:]
        if "=" in name and re.fullmatch(r"\w+=.*", name) and not args:
            k, v = name.split("=", 1)
            st.env[k] = v
            return 0
        if name in self.handlers:
            rc, o, e = self.handlers[name](self.owner, args, stdin)
            out += o
            err += e
            return rc
        if name == "echo":
            nl = not (args and args[0] == "-n")
            out += (" ".join(args[0 if nl else 1:]) + ("\n" if nl else "")).encode()
        elif name == "printf":
            fmt = (args[0] if args else "").replace("\\n", "\n").replace("\\t", "\t")
            vals = [int(a) if re.fullmatch(r"-?\d+", a) else a for a in args[1:]]
            try:
                out += (fmt % tuple(vals) if vals else fmt.replace("%%", "%")).encode()
            except (TypeError, ValueError):
                out += fmt.encode()
        elif name == "cat":
            if not args:
                out += stdin
            for a in args:
                p = self._path(st, a)
                if p not in self.files:
                    err += f"cat: {a}: No such file or directory\n".encode()
                    return 1
                out += self.files[p]
        elif name == "ls":
            d = self._path(st, args[-1] if args else ".").rstrip("/") + "/"
            names = sorted({k[len(d):].split("/")[0] for k in self.files if k.startswith(d)})
            out += "".join(n + "\n" for n in names).encode()
        elif name == "pwd":
            out += (st.cwd + "\n").encode()
        elif name == "cd":
            st.cwd = self._path(st, args[0] if args else "/root")
        elif name == "mkdir":
            pass  # directories are implicit
        elif name == "touch":
            for a in args:
                self.files.setdefault(self._path(st, a), b"")
        elif name == "rm":
            for a in (x for x in args if not x.startswith("-")):
                p = self._path(st, a)
                for k in [k for k in self.files if k == p or k.startswith(p.rstrip("/") + "/")]:
                    del self.files[k]
        elif name in ("test", "["):
            return self._test([a for a in args if a != "]"], st)
        elif name == "true":
            return 0
        elif name == "false":
            return 1
        elif name == "exit":
            raise _Exit(int(args[0]) if args else st.status)
        elif name == "export":
            for a in args:
                k, _, v = a.partition("=")
                st.env[k] = v
        elif name == "sleep":
            await self.sleep(float(args[0]) if args else 0.0, ctx)
        else:
            err += f"sh: {name}: not found\n".encode()
            return 127
        return 0

    def _test(self, args: list[str], st: ShellState) -> int:
        if len(args) == 2:
            op, a = args
            p = self._path(st, a)
            ok = {
                "-f": p in self.files, "-e": p in self.files or self._isdir(p),
                "-d": self._isdir(p), "-n": a != "", "-z": a == "",
            }.get(op, False)
            return 0 if ok else 1
        if len(args) == 3 and args[1] in ("=", "!="):
            return 0 if (args[0] == args[2]) == (args[1] == "=") else 1
        return 2

    def _isdir(self, p: str) -> bool:
        prefix = p.rstrip("/") + "/"
        return p == "/" or any(k.startswith(prefix) for k in self.files)
