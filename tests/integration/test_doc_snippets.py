"""Every fenced example in README.md and docs/*.md runs as written, or is at least checked.

A block's mode is the HTML comment on the line right before its opening fence:

- ``<!-- snippet: run -->``: run as written (bash with ``-euo pipefail``, python as a script),
  in a scratch folder shared by the blocks of one file, in order, with the venv on PATH;
- ``<!-- snippet: run-fast ARGS -->``: the same, with ARGS inserted after every
  ``rollbank COMMAND`` (a fast equivalent: ``--inference.kind fake`` for a block that would
  start vLLM);
- ``<!-- snippet: parse-only -->`` (the default for bash and python blocks without a comment):
  every ``rollbank ...`` line must name a real command and only flags its ``--help-all`` (or
  ``--help``) lists, every ``scripts/X`` must exist; python must parse and its
  ``from rollbank... import`` names must exist.

Blocks in other languages are output (``text``, none) or TOML (parsed). Relative links between
the pages must point at files that exist.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent
_MODE = re.compile(r"<!--\s*snippet:\s*([a-z-]+)\s*(.*?)\s*-->")
_FENCE = re.compile(r"^(`{3,})\s*([A-Za-z0-9_+-]*)")
CODE = {"bash", "sh", "shell", "console", "python", "py"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    mode: str
    args: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), len(lines))
        mode = _MODE.search(lines[i - 1]) if i > 0 else None
        default = "parse-only" if lang in CODE else "output"
        out.append(Block(page, i + 1, lang, mode.group(1) if mode else default,
                         mode.group(2) if mode else "", "\n".join(lines[i + 1:end])))
        i = end + 1
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.setdefault("ROLLBANK_SERVICE_TOKEN", "snippet-test-token-0123456789abcdef")
    return env


def _commands(text: str) -> list[str]:
    """The logical command lines of a shell block (``$ `` prompts stripped, ``\\``
    continuations joined; a block with prompts keeps only the prompted lines)."""
    raw = text.splitlines()
    prompted = any(ln.startswith("$ ") for ln in raw)
    out: list[str] = []
    cont = False
    for ln in raw:
        if cont:
            out[-1] = out[-1].rstrip("\\") + " " + ln.strip()
        elif prompted and not ln.startswith("$ "):
            continue
        else:
            out.append(ln[2:] if prompted else ln)
        cont = out[-1].endswith("\\") if out else False
    return [c for c in out if c.strip() and not c.lstrip().startswith("#")]


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


@functools.cache
def _help(path: tuple[str, ...]) -> str | None:
    """``rollbank PATH --help-all`` (or ``--help``); None when PATH is not a command."""
    for flag in ("--help-all", "--help"):
        done = subprocess.run([str(VENV_BIN / "rollbank"), *path, flag], capture_output=True,
                              text=True, env=_env(), timeout=120, check=False)
        if done.returncode == 0:
            return done.stdout
    return None


def check_rollbank_line(words: list[str], where: str) -> None:
    path: list[str] = []
    for w in words[1:]:
        if w.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", w):
            break
        parent = _help(tuple(path))
        if parent is None or not re.search(r"\{[^}]*\b" + re.escape(w) + r"\b[^}]*\}", parent):
            break
        path.append(w)
    assert path, f"{where}: `{' '.join(words)}` names no rollbank command"
    text = _help(tuple(path))
    assert text is not None, f"{where}: `rollbank {' '.join(path)} --help` failed"
    for w in words[1 + len(path):]:
        if w.startswith("--"):
            flag = w.split("=", 1)[0]
            assert re.search(re.escape(flag) + r"(?![\w.-])", text), \
                f"{where}: `rollbank {' '.join(path)}` has no flag {flag}"


def parse_only(block: Block) -> None:
    if block.lang in ("python", "py"):
        tree = ast.parse(block.text, filename=block.where)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rollbank"):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    assert hasattr(module, alias.name), \
                        f"{block.where}: {node.module} has no {alias.name}"
        return
    for command in _commands(block.text):
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", command):
            words = _words(part)
            if not words:
                continue
            if words[0] in ("rollbank", ".venv/bin/rollbank"):
                check_rollbank_line(words, block.where)
            elif words[0].startswith("scripts/"):
                assert (ROOT / words[0]).is_file(), f"{block.where}: no {words[0]}"


def _fast(command: str, args: str) -> str:
    return re.sub(r"^(\s*(?:\S*/)?rollbank\s+[a-z-]+)", lambda m: f"{m.group(1)} {args}",
                  command)


def run(block: Block, cwd: Path) -> None:
    if block.lang in ("python", "py"):
        argv = [sys.executable, "-c", block.text]
    else:
        script = block.text if block.mode == "run" and not block.text.lstrip().startswith("$ ") \
            else "\n".join(_commands(block.text))
        if block.mode == "run-fast":
            script = "\n".join(_fast(c, block.args) for c in _commands(block.text))
        argv = ["bash", "-euo", "pipefail", "-c", script]
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=_env(),
                          timeout=300, check=False)
    assert done.returncode == 0, (f"{block.where} ({block.mode}) exited {done.returncode}\n"
                                  f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n"
                                  f"{done.stderr[-3000:]}")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_example_of_the_page_runs_or_is_checked(page: Path, tmp_path: Path) -> None:
    for block in blocks_of(page):
        if block.mode in ("run", "run-fast"):
            run(block, tmp_path)
        elif block.mode == "parse-only":
            parse_only(block)
        elif block.lang == "toml":
            tomllib.loads(block.text)
        else:
            assert block.mode == "output", f"{block.where}: unknown snippet mode {block.mode!r}"


def test_relative_links_between_pages_point_at_files() -> None:
    bad = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                bad.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not bad, bad


def test_the_readme_stays_short_and_every_code_block_has_a_checked_mode() -> None:
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) < 250
    modes = [b.mode for b in blocks_of(readme) if b.lang in CODE]
    assert modes and "run" in modes and set(modes) <= {"run", "run-fast", "parse-only"}
