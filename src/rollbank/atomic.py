"""One atomic directory write: a reader sees the old directory or the new one, never half.

:func:`write_dir` runs ``write(tmp)`` into a hidden temporary directory in the target's own
parent (same filesystem, so the final step is a rename), fsyncs every file and directory in
it, then puts it in place in one step and fsyncs the parent:

- no directory at the target: ``renameat2(RENAME_NOREPLACE)`` (a target that appeared
  meanwhile is :class:`FileExistsError`, never silently replaced);
- a directory there and ``replace=True``: ``renameat2(RENAME_EXCHANGE)`` swaps the two in one
  step, then the old one (now under the temporary name) is deleted. The old directory is never
  deleted before the new one is in place.

Where the filesystem has no ``renameat2`` exchange, the old directory is first renamed aside
(``.<name>.old-<pid>``), the new one renamed in, then the old one deleted; a crash between the
two renames leaves the old one complete beside the target, and the next :func:`write_dir` or
:func:`recover` of that target renames it back.

Invariants
- A crash at any step leaves the target either absent (first write), or the complete old
  directory, or the complete new one; at most hidden leftovers beside it, which the next write
  of the same target removes.
- A failed ``write`` (an exception) removes its temporary directory and leaves the target as
  it was.

``step`` (tests) is called with each name of :data:`STEPS` as the write passes it, so a test
can crash the write between any two steps.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

STEPS = ("tmp_created", "written", "synced", "renamed", "old_removed", "parent_synced")

StepHook = Callable[[str], None]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _renameat2() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def _rename2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False where the call or the flag is not supported."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every regular file and every directory under ``root`` (``root`` included)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                fsync_path(p)
        fsync_path(Path(dirpath), directory=True)


def _aside_prefix(final: Path) -> str:
    return f".{final.name}.old-"


def _tmp_prefix(final: Path) -> str:
    return f".{final.name}.tmp-"


def recover(final: Path) -> None:
    """After a crash of the fallback path (old renamed aside, new not yet in): put the old
    directory back at ``final``; then remove every other leftover of writes of ``final``."""
    parent = final.parent
    if not parent.is_dir():
        return
    asides = sorted(p for p in parent.iterdir() if p.name.startswith(_aside_prefix(final)))
    if asides and not final.exists():
        asides[0].rename(final)
        asides = asides[1:]
        fsync_path(parent, directory=True)
    for p in asides + [p for p in parent.iterdir() if p.name.startswith(_tmp_prefix(final))]:
        shutil.rmtree(p, ignore_errors=True)


def write_dir(final: Path, write: Callable[[Path], object], *, replace: bool = False,
              step: StepHook | None = None, fallback: bool = False) -> Path:
    """Write the directory ``final`` atomically with ``write(tmp)``; see the module doc.
    ``replace=False``: an existing ``final`` is :class:`FileExistsError` (checked first and
    again at the rename). ``fallback``: do without ``renameat2`` (tests; it is used whenever
    the filesystem refuses it)."""
    hook: StepHook = step if step is not None else (lambda _name: None)
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    recover(final)
    if final.exists() and not replace:
        raise FileExistsError(f"{final} already exists")
    tmp = parent / f"{_tmp_prefix(final)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        hook("tmp_created")
        write(tmp)
        hook("written")
        fsync_tree(tmp)
        hook("synced")
        old = _install(tmp, final, replace=replace, exchange=not fallback)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    hook("renamed")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    hook("old_removed")
    fsync_path(parent, directory=True)
    hook("parent_synced")
    return final


def _install(tmp: Path, final: Path, *, replace: bool, exchange: bool) -> Path | None:
    """Put ``tmp`` at ``final``; the path the old directory now has (to delete), if any."""
    if not final.exists():
        if exchange and _rename2(tmp, final, _RENAME_NOREPLACE):
            return None
        if final.exists():  # the fallback: check, then rename (rename over an empty dir)
            raise FileExistsError(f"{final} already exists")
        tmp.rename(final)
        return None
    if not replace:
        raise FileExistsError(f"{final} already exists")
    if exchange and _rename2(tmp, final, _RENAME_EXCHANGE):
        return tmp  # tmp now names the old directory
    aside = final.parent / f"{_aside_prefix(final)}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    final.rename(aside)
    try:
        tmp.rename(final)
    except BaseException:
        with contextlib.suppress(OSError):
            aside.rename(final)
        raise
    return aside
