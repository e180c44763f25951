"""COPY and ADD of local files: Docker's semantics as a shell script for the build sandbox.

Owns: resolving COPY/ADD sources inside the build context, hashing them for the layer key,
staging here-documents and extracted archives, and the ``cp`` script that the build sandbox
runs (context bound read-only at :data:`CTX`, staging at :data:`STAGE`). Resolving the
destination *inside* the sandbox keeps the image's own symlinks (e.g. ``/lib -> usr/lib``)
intact, which copying into the layer directory from the host would not.

Semantics: a directory source copies its contents into DEST; several sources or a DEST
ending in ``/`` make DEST a directory; a single file goes to DEST, or into it when DEST is an
existing directory. Relative DEST is relative to WORKDIR. Globs are expanded in the context.
Files from the context belong to root (``--chown`` / ``--chmod`` applied to what was copied);
ADD extracts a local tar archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``)
keeping its owners; ``COPY --from=<stage>`` copies from an earlier stage of the same
Dockerfile (:func:`plan_from`: that stage's filesystem is mounted read-only at :data:`FROM`,
sources are resolved and globbed there); ADD of a URL, ``--from`` an image, and unknown flags
are errors.

Invariants: a source that escapes the context (``..``, absolute, or through a symlink) is a
:class:`~rollbank.errors.BuildError` naming the file and line; the layer key covers every byte
and mode of every source.
"""

from __future__ import annotations

import glob
import hashlib
import json
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path
from shlex import quote as _q

from rollbank.errors import BuildError
from rollbank.tasks import dockerfile as df

CTX, STAGE, FROM = "/run/rollbank-ctx", "/run/rollbank-stage", "/run/rollbank-from"
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
FLAGS = {"chown", "chmod", "link"}


@dataclass(frozen=True)
class CopyPlan:
    script: list[str]  # shell lines run as root in the build sandbox
    digest: str  # hash of every source (part of the layer key)
    dest: str  # absolute destination
    binds: list[tuple[Path, str]]  # host dir -> path in the sandbox (read-only)


def plan(ins: df.Instruction, *, context: Path, stage: Path, workdir: str,
         scope: dict[str, str], file: Path) -> CopyPlan:
    kw, line = ins.keyword, ins.line
    flags = dict(ins.flags)
    for name in flags:
        if name == "from":
            raise BuildError(f"{kw} --from: no earlier stage named {flags[name]!r} (images cannot "
                             "be pulled)", file=file, line=line)
        if name not in FLAGS:
            raise BuildError(f"{kw} --{name} is not supported", file=file, line=line)
    words = [df.substitute(w, scope) for w in df.split_words(ins.rest, keyword=kw, file=file, line=line)]
    if len(words) < 2:
        raise BuildError(f"{kw} needs a source and a destination", file=file, line=line)
    dest = words[-1] if words[-1].startswith("/") else posixpath.join(workdir, words[-1])
    dest = posixpath.normpath(dest) + ("/" if words[-1].endswith("/") else "")
    ctx = context.resolve()
    stage.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    items: list[tuple[str, bool]] = []  # (path inside the sandbox, is a directory)
    for i, src in enumerate(words[:-1]):
        doc = next((d for d in ins.heredocs if src in (f"<<{d.name}", f"<<-{d.name}")), None)
        if doc is not None:
            body = df.substitute(doc.body, scope) if doc.expand else doc.body
            (stage / f"doc{i}").mkdir()
            (stage / f"doc{i}" / doc.name).write_text(body)
            h.update(f"doc\0{doc.name}\0{body}".encode())
            items.append((f"{STAGE}/doc{i}/{doc.name}", False))
            continue
        if "://" in src:
            raise BuildError(f"{kw} of a URL ({src}) is not supported offline", file=file, line=line)
        for match in expand(ctx, src, kw, file, line):
            rel = match.relative_to(ctx).as_posix() if match != ctx else "."
            h.update(f"src\0{rel}\0".encode())
            hash_tree(match, h)
            if kw == "ADD" and match.is_file() and match.name.endswith(TAR_SUFFIXES):
                out = stage / f"tar{i}-{len(items)}"
                out.mkdir()
                extract(match, out, file, line)
                items.append((f"{STAGE}/{out.name}", True))
            else:
                items.append((f"{CTX}/{rel}", match.is_dir()))
    many = len(words) > 2 or dest.endswith("/") or len(items) > 1
    dest = dest.rstrip("/") or "/"
    script = ["set -e"]
    for path, is_dir in items:
        cp = "cp -a --no-preserve=ownership" if path.startswith(CTX) else "cp -a"
        if is_dir:
            script.append(f"mkdir -p {_q(dest)} && {cp} {_q(path + '/.')} {_q(dest + '/')}")
            targets = f"(cd {_q(path)} && find . -mindepth 1) | (cd {_q(dest)} && xargs -r -d '\\n' %s)"
        elif many:
            script.append(f"mkdir -p {_q(dest)} && {cp} {_q(path)} {_q(dest + '/')}")
            targets = f"%s {_q(posixpath.join(dest, posixpath.basename(path)))}"
        else:
            into = _q(posixpath.join(dest, posixpath.basename(path)))
            script.append(f"if [ -d {_q(dest)} ]; then {cp} {_q(path)} {_q(dest + '/')}; else "
                          f"mkdir -p {_q(posixpath.dirname(dest) or '/')} && {cp} {_q(path)} {_q(dest)}; fi")
            targets = f"if [ -d {_q(dest)} ]; then %s {into}; else %s {_q(dest)}; fi"
        for flag, cmd in (("chown", "chown -h"), ("chmod", "chmod")):
            if flags.get(flag):
                script.append(targets.replace("%s", f"{cmd} {_q(df.substitute(flags[flag], scope))}"))
    h.update(json.dumps(sorted(flags.items())).encode())
    return CopyPlan(script, h.hexdigest(), dest, [(ctx, CTX), (stage, STAGE)])


def plan_from(ins: df.Instruction, *, stage_key: str, workdir: str, scope: dict[str, str],
              file: Path) -> CopyPlan:
    """``COPY --from=<stage>``: copy from the stage mounted at :data:`FROM` inside the sandbox.

    The digest is the stage's final layer key plus the instruction, which fixes the content.
    """
    kw, line = ins.keyword, ins.line
    flags = dict(ins.flags)
    if kw != "COPY":
        raise BuildError("ADD --from is not supported (Docker has no such flag)", file=file, line=line)
    for name in flags:
        if name not in FLAGS | {"from"}:
            raise BuildError(f"{kw} --{name} is not supported", file=file, line=line)
    words = [df.substitute(w, scope) for w in df.split_words(ins.rest, keyword=kw, file=file, line=line)]
    if len(words) < 2:
        raise BuildError(f"{kw} needs a source and a destination", file=file, line=line)
    dest = words[-1] if words[-1].startswith("/") else posixpath.join(workdir, words[-1])
    into_dir = words[-1].endswith("/") or len(words) > 2
    dest = posixpath.normpath(dest)
    fix_dir = fix_file = ""
    for flag, cmd in (("chown", "chown -h"), ("chmod", "chmod")):
        if flags.get(flag):
            arg = _q(df.substitute(flags[flag], scope))
            fix_dir += f"; (cd \"$s\" && find . -mindepth 1) | (cd {_q(dest)} && xargs -r -d '\\n' {cmd} {arg})"
            fix_file += f"; {cmd} {arg} \"$t\""
    script = ["set -e"]
    for src in words[:-1]:
        norm = posixpath.normpath("/" + src.lstrip("/"))
        # Globs expand inside the stage; a source matching nothing is an error, as in Docker.
        script.append(f"set -- {FROM}{_glob_quote(norm)}; [ -e \"$1\" ] || [ -L \"$1\" ] || "
                      f"{{ echo {_q(f'COPY --from: {src} not found in the stage')} >&2; exit 1; }}")
        script.append(
            'for s in "$@"; do '
            f'if [ -d "$s" ] && [ ! -L "$s" ]; then mkdir -p {_q(dest)} && cp -a "$s/." {_q(dest + "/")}{fix_dir}; '
            f'elif [ {"1" if into_dir else "0"} = 1 ] || [ "$#" -gt 1 ] || [ -d {_q(dest)} ]; then '
            f'mkdir -p {_q(dest)} && cp -a "$s" {_q(dest + "/")}; t={_q(dest)}/"$(basename "$s")"{fix_file}; '
            f'else mkdir -p "$(dirname {_q(dest)})" && cp -a "$s" {_q(dest)}; t={_q(dest)}{fix_file}; fi; done')
    digest = hashlib.sha256(json.dumps([stage_key, ins.args, sorted(flags.items())]).encode()).hexdigest()
    return CopyPlan(script, digest, dest, [])


def _glob_quote(path: str) -> str:
    """Quote ``path`` for sh, leaving glob characters (``* ? [``) active."""
    out = []
    for ch in path:
        out.append(ch if ch in "*?[]" or ch.isalnum() or ch in "/._-+" else "\\" + ch)
    return "".join(out)


def expand(ctx: Path, src: str, kw: str, file: Path, line: int) -> list[Path]:
    """Sources matching ``src`` in the context, each resolved and checked to stay inside."""
    norm = None if src.startswith("/") else posixpath.normpath(src)
    if norm is None or norm == ".." or norm.startswith("../"):
        raise BuildError(f"{kw} source {src!r} escapes the build context {ctx}", file=file, line=line)
    matches = sorted(ctx.glob(norm)) if glob.has_magic(norm) else [ctx / norm]
    out = []
    for p in matches:
        if not p.exists():
            raise BuildError(f"{kw} source {src!r} not found in {ctx}", file=file, line=line)
        resolved = p.resolve()
        if resolved != ctx and ctx not in resolved.parents:
            raise BuildError(f"{kw} source {src!r} escapes the build context (-> {resolved})",
                             file=file, line=line)
        out.append(resolved)
    if not out:
        raise BuildError(f"{kw} source {src!r} matches no file", file=file, line=line)
    return out


def hash_tree(path: Path, h: hashlib._Hash) -> None:
    paths = [path] if not path.is_dir() else sorted(path.rglob("*"))
    for p in paths:
        st = p.lstat()
        h.update(f"{p.relative_to(path) if p != path else ''}\0{st.st_mode}\0".encode())
        if p.is_symlink():
            h.update(str(p.readlink()).encode())
        elif p.is_file():
            h.update(p.read_bytes())


def extract(archive: Path, out: Path, file: Path, line: int) -> None:
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(out, filter="tar")  # refuses absolute and escaping members
    except (tarfile.TarError, OSError) as exc:
        raise BuildError(f"ADD {archive.name}: cannot extract: {exc}", file=file, line=line) from exc
