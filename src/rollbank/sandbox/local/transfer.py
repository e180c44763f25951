"""File transfer of local sandboxes: packing a host tree for ``upload``, unpacking a
``download`` (tar members filtered: no absolute paths, no links out of the target, no devices).

Invariant: a download never writes outside ``local``; it is extracted to a temporary
directory beside it first, then moved into place.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from pathlib import Path

from rollbank.errors import SandboxError


def pack(local: Path) -> tuple[bool, bytes, int]:
    """(is a directory, tar of the directory or the file's bytes, file mode)."""
    if local.is_dir():
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(local), arcname=".")
        return True, buf.getvalue(), 0o755
    return False, local.read_bytes(), local.stat().st_mode & 0o7777


def unpack(data: bytes, name: str, local: Path) -> None:
    """Extract a tar holding ``name`` (refusing unsafe members) to ``local``."""
    parent = local.parent if local.parent.exists() else None
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            try:
                tar.extractall(tmp, filter="data")
            except tarfile.FilterError as exc:  # a link out of the target, a device, ...
                raise SandboxError(f"download refused an unsafe member: {exc}") from exc
        if local.is_dir():
            shutil.rmtree(local)
        shutil.move(Path(tmp) / name, local)
