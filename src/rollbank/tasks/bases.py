"""Base filesystems: map a Dockerfile ``FROM`` image to a Debian root filesystem.

Images cannot be pulled here (no registry but Debian's and PyPI). Every supported base image
maps to one Debian 12 (bookworm) root filesystem built once with ``mmdebstrap`` from Debian's
packages and cached under ``<cache>/bases/<name>-<recipe digest>``. What the mapping changes
(distribution, Python version) is reported as an *approximation* and recorded with each build.

Invariants
- A base directory is only ever visible complete: it is built in a temporary directory and
  renamed into place; concurrent builders serialise on a lock file.
- The recipe digest covers the package list and hooks, so changing them builds a new base.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from shlex import quote as _q

from rollbank.config import cache_dir
from rollbank.errors import BuildError

SUITE = "bookworm"
#: Extra CA certificates the host trusts (e.g. an egress proxy's); copied into every base so
#: builds that reach the package registries work where the host's do.
HOST_EXTRA_CAS = Path("/usr/local/share/ca-certificates")
DEBIAN_PYTHON = "3.11"

#: Packages in every base: what Terminal-Bench style images and verifiers expect (pytest for
#: offline verifiers, tmux + asciinema as in Terminal-Bench's own bases) plus common tools.
BASE_PACKAGES: tuple[str, ...] = (
    "python3", "python3-pytest", "python3-venv", "python3-pip", "git", "make", "gcc",
    "libc6-dev", "sqlite3", "tmux", "procps", "ca-certificates", "xz-utils", "bzip2", "unzip",
    "zip", "file", "less", "curl", "asciinema", "jq", "patch", "bc",
)

#: Commands run in the finished root filesystem (via chroot) before it is frozen.
CUSTOMIZE: tuple[str, ...] = (
    # python:3.x images let pip install into the system interpreter; Debian refuses (PEP 668).
    "rm -f /usr/lib/python3*/EXTERNALLY-MANAGED",
    # The registries may be reached through a TLS-intercepting proxy whose CA only the host
    # trusts: the host's extra CAs were copied to /usr/local/share/ca-certificates.
    "update-ca-certificates >/dev/null 2>&1 || true",
    # Harbor verifiers call pytest 8.4.1 with --ctrf (the plugin needs pytest >= 7.4, Debian has
    # 7.2): provide both offline (engineer A, additive).
    "python3 -m pip install -q --no-cache-dir --disable-pip-version-check pytest==8.4.1 pytest-json-ctrf==0.3.5",
    "mkdir -p /app /logs /tests && chmod 1777 /tmp",
)


@dataclass(frozen=True)
class BaseImage:
    """A ready base root filesystem and what it approximates."""

    image: str  # the image named in FROM
    name: str  # the base it maps to, e.g. "debian-bookworm"
    path: Path  # the root filesystem directory (read-only lower layer)
    digest: str  # recipe digest (part of every layer hash built on it)
    approximations: tuple[str, ...]


_UBUNTU = re.compile(r"^(docker\.io/)?(library/)?(ubuntu|debian)(:[\w.\-]+)?$")
_PYTHON = re.compile(r"^(docker\.io/)?(library/)?python(:(?P<ver>\d+\.\d+)[\w.\-]*)?$")
_TBENCH = re.compile(r"^ghcr\.io/laude-institute/t-bench/(?P<kind>ubuntu-24-04|python-3-13)(:[\w.\-]+)?$")


def map_image(image: str, *, file: Path | str | None = None, line: int | None = None) -> tuple[str, tuple[str, ...]]:
    """Return (base name, approximations) for a FROM image, or raise :class:`BuildError`."""
    image = image.strip()
    base = f"debian-{SUITE}"
    if image in ("scratch",):
        raise BuildError("FROM scratch is not supported", file=file, line=line)
    if m := _UBUNTU.match(image):
        if m.group(3) == "debian" and (m.group(4) or ":bookworm").lstrip(":") in ("12", "bookworm", "bookworm-slim", "latest", "stable", "stable-slim"):
            return base, ()
        return base, (f"{image} approximated by Debian 12 (bookworm) packages",)
    if m := _PYTHON.match(image):
        ver = m.group("ver")
        approx = [f"{image} approximated by Debian 12 (bookworm) with its system Python"]
        if ver is not None and ver != DEBIAN_PYTHON:
            approx.append(f"Python {ver} requested, Python {DEBIAN_PYTHON} provided")
        return base, tuple(approx)
    if m := _TBENCH.match(image):
        approx = [f"{image} approximated by Debian 12 (bookworm) with tmux and asciinema"]
        if m.group("kind") == "python-3-13":
            approx.append(f"Python 3.13 requested, Python {DEBIAN_PYTHON} provided")
        return base, tuple(approx)
    raise BuildError(
        f"base image {image!r} cannot be provided offline; supported: ubuntu:*, debian:*, "
        "python:3.*, ghcr.io/laude-institute/t-bench/{ubuntu-24-04,python-3-13}",
        file=file, line=line, field="FROM",
    )


def recipe_digest() -> str:
    recipe = {"suite": SUITE, "packages": sorted(BASE_PACKAGES), "customize": list(CUSTOMIZE)}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def ensure_base(image: str, *, file: Path | str | None = None, line: int | None = None) -> BaseImage:
    """The base filesystem for ``image``, building it (about 30 s) the first time."""
    name, approximations = map_image(image, file=file, line=line)
    digest = recipe_digest()
    root = cache_dir() / "bases"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{digest}"
    if not (target / ".rollbank-base").exists():
        with open(root / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / ".rollbank-base").exists():
                _build(target)
    return BaseImage(image, name, target, digest, approximations)


def _build(target: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap is not installed (scripts/setup.sh installs it)")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    hooks = [
        f'--customize-hook=cp {_q(str(crt))} "$1/usr/local/share/ca-certificates/"'
        for crt in sorted(HOST_EXTRA_CAS.glob("*.crt"))
    ]
    # A clean environment: the host's variables (PIP_CERT=... paths) must not leak in.
    hooks += [
        f'--customize-hook=env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root chroot "$1" sh -c {_q(cmd)}'
        for cmd in CUSTOMIZE
    ]
    cmd = [
        "mmdebstrap", "--variant=minbase", "--mode=root", "--quiet",
        "--include=" + ",".join(BASE_PACKAGES), *hooks, SUITE, str(tmp),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"mmdebstrap failed ({proc.returncode}): {proc.stderr[-2000:]}")
    (tmp / ".rollbank-base").write_text(json.dumps({"suite": SUITE, "digest": recipe_digest()}) + "\n")
    tmp.rename(target)
