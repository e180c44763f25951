"""Image references as tasks publish them: registry prefixes, tags and pinned digests.

Owns: splitting ``FROM`` references such as
``public.ecr.aws/docker/library/debian:bookworm-slim@sha256:<64 hex>`` into the Docker Hub
repository (``debian``), the tag (``bookworm-slim``) and the digest. Mirrors of Docker Hub's
official images (``docker.io/library/``, ``index.docker.io/``, ``registry-1.docker.io/``,
``public.ecr.aws/docker/library/``, ``mirror.gcr.io/library/``) name the same image as the
bare name, so they map to the same base family. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rollbank.errors import BuildError

#: Registry hosts (and path prefixes) that serve Docker Hub's official images unchanged.
HUB_MIRRORS: tuple[str, ...] = (
    "docker.io/library/", "docker.io/", "index.docker.io/library/", "index.docker.io/",
    "registry-1.docker.io/library/", "registry-1.docker.io/", "public.ecr.aws/docker/library/",
    "mirror.gcr.io/library/", "mirror.gcr.io/", "library/",
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference. ``repository`` is Docker Hub's short name for official images
    (``debian``, ``golang``) and the full name (``ghcr.io/org/img``) otherwise."""

    original: str
    repository: str
    tag: str
    digest: str | None
    mirror: str | None  # the Docker Hub mirror prefix that was stripped, if any

    @property
    def name(self) -> str:
        """``repository:tag`` (no registry, no digest)."""
        return f"{self.repository}:{self.tag}"


def parse(image: str, *, file: Path | str | None = None, line: int | None = None) -> ImageRef:
    """Parse ``image``; a malformed reference is a :class:`BuildError` naming ``file``:``line``."""
    text = image.strip()
    if any(c.isspace() for c in text):  # a registry host is checked apart from the path
        raise BuildError(f"malformed image reference {image!r} (whitespace inside)",
                         file=file, line=line, field="FROM")
    ref, _, digest = text.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise BuildError(f"malformed image digest {digest!r} (expected sha256:<64 hex>)",
                         file=file,
                         line=line, field="FROM")
    mirror = None
    low = ref.lower()
    for prefix in HUB_MIRRORS:
        if low.startswith(prefix):
            mirror, ref = prefix, ref[len(prefix):]
            break
    last = ref.rsplit("/", 1)[-1]
    repo, tag = (ref.rsplit(":", 1) if ":" in last else (ref, "latest"))
    host = repo.split("/", 1)[0]
    check = repo.split("/", 1)[1] if "/" in repo and ("." in host or ":" in host) else repo
    if not repo or not _NAME.fullmatch(check) or not _TAG.fullmatch(tag):
        raise BuildError(f"malformed image reference {image!r}",
                         file=file,
                         line=line, field="FROM")
    return ImageRef(image, repo, tag, digest or None, mirror)
