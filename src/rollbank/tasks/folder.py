"""Safety checks and the content hash of a task folder (shared by both loaders).

Owns: walking a task folder once, refusing what is unsafe, and hashing what is there.

Invariants
- Symlinks are never followed out of the folder: a symlink whose target resolves outside the
  task folder (or dangles) is a :class:`~rollbank.errors.TaskError` naming it.
- Only regular files, directories and in-folder symlinks are allowed (no fifos, devices).
- No file exceeds ``max_file_mb`` and the folder does not exceed ``max_total_mb``.
- The content hash is sha256 over every entry's relative path, kind, executable bit and bytes
  (or link target), in sorted order; it changes when any file of the folder changes.
- Nothing is written: loading has no side effects, so it never leaves half-built state.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import yaml

from rollbank.errors import TaskError
from rollbank.tasks.config import LoaderConfig

MAX_NUMBER = 1e12  # timeouts, sizes, cpus: larger is a typo (and int() of it stays exact)
IGNORED_NAMES = frozenset({".git", "__pycache__", ".pytest_cache", ".DS_Store"})


def scan(root: Path, config: LoaderConfig) -> str:
    """Check ``root`` for unsafe entries and return its content hash (hex sha256)."""
    root = root.resolve()
    try:
        root.name.encode("utf-8")
    except UnicodeEncodeError as exc:  # the name becomes the task id, in JSON and Parquet
        raise TaskError("the task folder's name is not valid UTF-8", file=root) from exc
    h = hashlib.sha256()
    total = 0
    max_file = int(config.max_file_mb * 1024 * 1024)
    max_total = int(config.max_total_mb * 1024 * 1024)
    entries: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_NAMES)
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            if name not in IGNORED_NAMES:
                entries.append(Path(dirpath) / name)
    for path in sorted(entries):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            target = str(path.readlink())
            check_inside(root, path, what="symlink")
            h.update(b"L\0" + os.fsencode(rel) + b"\0" + os.fsencode(target) + b"\0")
        elif stat.S_ISREG(st.st_mode):
            if st.st_size > max_file:
                raise TaskError(f"file is {st.st_size} bytes, over the {config.max_file_mb:g} MiB limit",
                                file=path)
            total += st.st_size
            if total > max_total:
                raise TaskError(f"task folder exceeds {config.max_total_mb:g} MiB", file=root)
            # names as the file system has them (a non-UTF-8 name must not crash the hash)
            h.update(b"F\0" + os.fsencode(rel) + f"\0{1 if st.st_mode & 0o111 else 0}\0{st.st_size}\0".encode())
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        else:
            raise TaskError("not a regular file, directory or symlink", file=path)
    return h.hexdigest()


def check_inside(root: Path, path: Path, *, what: str, field: str | None = None,
                 source: Path | None = None) -> Path:
    """Resolve ``path`` (following symlinks) and require it to stay under ``root``."""
    try:
        resolved = path.resolve(strict=True)
    except (FileNotFoundError, RuntimeError) as exc:
        raise TaskError(f"{what} {path} does not resolve (dangling or looping)",
                        file=source or path, field=field) from exc
    if resolved != root and root not in resolved.parents:
        raise TaskError(f"{what} {path} escapes the task folder (-> {resolved})",
                        file=source or path, field=field)
    return resolved


def read_text(path: Path, config: LoaderConfig, *, required: bool = True) -> str | None:
    """Read a small UTF-8 text file of the task, or None if absent and not required."""
    if not path.exists() and not path.is_symlink():
        if required:
            raise TaskError("required file is missing", file=path)
        return None
    if not path.is_file():
        raise TaskError("expected a regular file", file=path)
    if path.stat().st_size > config.max_text_kb * 1024:
        raise TaskError(f"file is larger than {config.max_text_kb} KiB", file=path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"not UTF-8 text: {exc}", file=path) from exc


def load_toml(path: Path, config: LoaderConfig) -> dict[str, Any]:
    text = read_text(path, config)
    assert text is not None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"invalid TOML: {exc}", file=path) from exc
    except RecursionError as exc:
        raise TaskError("invalid TOML: nested too deeply", file=path) from exc


def load_yaml(path: Path, config: LoaderConfig) -> dict[str, Any]:
    text = read_text(path, config)
    assert text is not None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = None
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            line = int(mark.line) + 1
        raise TaskError(f"invalid YAML: {exc}", file=path, line=line) from exc
    except RecursionError as exc:
        raise TaskError("invalid YAML: nested too deeply", file=path) from exc
    if not isinstance(data, dict):
        raise TaskError("expected a mapping at the top level", file=path)
    return data


class Fields:
    """Typed access to a parsed config table; errors name the file and dotted field."""

    def __init__(self, data: dict[str, Any], *, file: Path, prefix: str = "") -> None:
        self.data = data
        self.file = file
        self.prefix = prefix
        self.used: set[str] = set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def table(self, key: str) -> Fields:
        self.used.add(key)
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            raise TaskError(f"expected a table, got {type(value).__name__}", file=self.file,
                            field=self._name(key))
        return Fields(value, file=self.file, prefix=f"{self._name(key)}.")

    def number(self, key: str, default: float, *, minimum: float = 0.0) -> float:
        self.used.add(key)
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TaskError(f"expected a number, got {value!r}", file=self.file, field=self._name(key))
        if not math.isfinite(value) or value > MAX_NUMBER:  # nan, inf, 1e400 (TOML has them)
            raise TaskError(f"expected a finite number up to {MAX_NUMBER:g}, got {value!r}",
                            file=self.file, field=self._name(key))
        if value <= minimum:
            raise TaskError(f"must be > {minimum:g}, got {value!r}", file=self.file, field=self._name(key))
        return float(value)

    def integer(self, key: str, default: int) -> int:
        value = self.number(key, default)
        if value != int(value):
            raise TaskError(f"expected an integer, got {value!r}", file=self.file, field=self._name(key))
        return int(value)

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                raise TaskError("required field is missing", file=self.file, field=self._name(key))
            return default
        value = self.data[key]
        if not isinstance(value, str):
            raise TaskError(f"expected a string, got {value!r}", file=self.file, field=self._name(key))
        if "\0" in value:
            raise TaskError("contains a NUL character", file=self.file, field=self._name(key))
        return value

    def boolean(self, key: str, default: bool) -> bool:
        self.used.add(key)
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise TaskError(f"expected true/false, got {value!r}", file=self.file, field=self._name(key))
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        self.used.add(key)
        value = self.data.get(key, [])
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TaskError(f"expected a list of strings, got {value!r}", file=self.file,
                            field=self._name(key))
        return tuple(value)

    def env(self, key: str) -> dict[str, str]:
        self.used.add(key)
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            raise TaskError(f"expected a table of strings, got {value!r}", file=self.file,
                            field=self._name(key))
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise TaskError(f"expected a string value, got {v!r}", file=self.file,
                                field=f"{self._name(key)}.{k}")
            if not str(k) or "=" in str(k) or "\0" in str(k) + str(v):
                raise TaskError("an environment variable needs a name without '=' and no NUL",
                                file=self.file, field=f"{self._name(key)}.{k}")
            out[str(k)] = str(v)
        return out

    def unknown(self, known: set[str] | None = None) -> dict[str, Any]:
        """Keys neither read nor listed in ``known``."""
        skip = self.used | (known or set())
        return {f"{self.prefix}{k}": v for k, v in self.data.items() if k not in skip}


def check_dockerfile(dockerfile: Path, context: Path) -> None:
    """Parse a task's Dockerfile early and refuse COPY/ADD sources escaping the context.

    Sources with unresolved ``$`` variables are checked again by the builder after ARG/ENV
    substitution; here the literal text is checked, which catches ``../`` and absolute paths.
    """
    from rollbank.errors import BuildError
    from rollbank.tasks import dockerfile as df

    try:
        instructions = df.parse_file(dockerfile)
    except BuildError as exc:
        raise TaskError(exc.message, file=dockerfile, line=exc.line) from exc
    root = context.resolve()
    for ins in instructions:
        if ins.keyword not in ("COPY", "ADD") or ins.heredocs:
            continue
        if any(name == "from" for name, _ in ins.flags):
            continue  # the builder reports multi-stage COPY --from with its line
        try:
            words = df.split_words(ins.rest, keyword=ins.keyword, file=dockerfile, line=ins.line)
        except BuildError as exc:
            raise TaskError(exc.message, file=dockerfile, line=exc.line) from exc
        for src in words[:-1]:
            if "$" in src or "://" in src:
                continue
            if src.startswith("/") or os.path.normpath(src).startswith(".."):
                raise TaskError(f"{ins.keyword} source {src!r} escapes the build context {context}",
                                file=dockerfile, line=ins.line)
            candidate = root / src
            if candidate.exists() or candidate.is_symlink():
                check_inside(root, candidate, what=f"{ins.keyword} source", source=dockerfile)
