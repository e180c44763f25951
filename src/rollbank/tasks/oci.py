"""Images as published: pulled from an OCI registry, unpacked into a rootfs, cached by digest.

Owns which ``FROM`` / ``docker_image`` references are pulled (:func:`source_for`), the pull
itself and the image's config (``USER``, ``WORKDIR``, ``ENV``, ``ENTRYPOINT``, ``CMD``).
The tools are Debian's: ``skopeo`` speaks the distribution API (token auth, digests,
multi-arch indexes: the host's platform is chosen) and copies the image into an OCI layout;
``umoci`` unpacks its layers in order (whiteouts applied) into one root filesystem (zstd
layers are decompressed to plain tar first: umoci 0.4.7 reads gzip and plain tar only).

Which references are pulled (``[builder]`` config, :class:`rollbank.tasks.config.BuilderConfig`)
- A reference naming a registry host listed in ``registries`` (default: the loopback hosts,
  any port) is pulled from it; loopback registries are spoken to over plain HTTP, others
  over verified TLS.
- A Docker Hub name (``debian:bookworm``, ``docker.io/library/python:3.11``) is pulled from
  ``hub_mirror`` when one is set (``<mirror>/library/debian:bookworm``).
- Anything else is not pulled: the Debian recipes of :mod:`rollbank.tasks.bases` serve it,
  reported as an approximation (they also serve a pull that failed, naming why).

Cache: ``<cache>/images/<manifest digest hex>/`` holds ``rootfs/`` and ``image.json`` (the
source, the digest, the config). A tag is resolved to its digest first (one manifest
request); a digest already cached is not pulled again. The copy is pinned to that digest, so
a tag moved between the two requests cannot mix images.

Invariants: an image directory is only ever visible complete (built under ``.tmp-*`` and
renamed into place; pullers of one digest serialise on a lock file); a pinned ``@sha256``
reference gets exactly that manifest (skopeo verifies it) or a :class:`BuildError`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rollbank.config import cache_dir
from rollbank.errors import BuildError
from rollbank.tasks import imageref

LOOPBACK_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}

#: Runs a tool (argv, timeout in seconds) and returns its result: the seam tests fake.
Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[bytes]"]


def run_tool(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    """The real runner: the tool with a clean environment (no proxy variables leak in)."""
    if shutil.which(argv[0], path=_ENV["PATH"]) is None:
        raise BuildError(f"{argv[0]} is not installed (scripts/setup.sh installs it)")
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout_s, check=False,
                              env=_ENV, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{argv[0]} {argv[1]} timed out after {timeout_s:g}s") from exc


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config says a container runs as (Docker's semantics)."""

    user: str | None = None  # None: root
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"user": self.user, "workdir": self.workdir, "env": self.env,
                "entrypoint": list(self.entrypoint), "cmd": list(self.cmd)}

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> ImageConfig:
        env = doc.get("env") or {}
        assert isinstance(env, dict)
        return cls(_opt_str(doc.get("user")), _opt_str(doc.get("workdir")),
                   {str(k): str(v) for k, v in env.items()}, _strs(doc.get("entrypoint")),
                   _strs(doc.get("cmd")))


def _opt_str(value: object) -> str | None:
    return str(value) if value else None


def _strs(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def parse_config(blob: bytes) -> ImageConfig:
    """An OCI / Docker image config blob -> :class:`ImageConfig` (``root``/``0`` user: None)."""
    try:
        doc = json.loads(blob)
    except ValueError as exc:
        raise BuildError(f"image config is not JSON: {exc}") from exc
    cfg = doc.get("config") or {} if isinstance(doc, dict) else {}
    if not isinstance(cfg, dict):
        raise BuildError("image config: 'config' is not an object")
    env: dict[str, str] = {}
    for item in cfg.get("Env") or []:
        key, _, value = str(item).partition("=")
        if key:
            env[key] = value
    user = str(cfg.get("User") or "").strip()
    return ImageConfig(
        user=None if user in ("", "root", "0", "0:0", "root:root") else user,
        workdir=str(cfg.get("WorkingDir") or "") or None, env=env,
        entrypoint=_strs(cfg.get("Entrypoint")), cmd=_strs(cfg.get("Cmd")),
    )


@dataclass(frozen=True)
class Source:
    """Where one image reference is pulled from."""

    reference: str  # host[:port]/repository (no tag, no digest)
    tag: str | None
    digest: str | None  # pinned by the reference
    tls_verify: bool

    @property
    def transport(self) -> str:
        """The skopeo ``docker://`` reference (by digest when pinned, else by tag)."""
        pin = f"@{self.digest}" if self.digest else f":{self.tag or 'latest'}"
        return f"docker://{self.reference}{pin}"

    def pinned(self, digest: str) -> str:
        return f"docker://{self.reference}@{digest}"


def _host(repository: str) -> str | None:
    first = repository.split("/", 1)[0]
    if "/" in repository and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[: host.index("]") + 1]
    return host.rsplit(":", 1)[0] if ":" in host else host


def source_for(image: str, *, registries: Sequence[str] = LOOPBACK_HOSTS,
               hub_mirror: str | None = None) -> Source | None:
    """The registry that serves ``image`` under the builder's policy, or None (not pulled)."""
    ref = imageref.parse(image)
    name, _, _ = ref.original.strip().partition("@")
    explicit_tag = ":" in name.rsplit("/", 1)[-1]
    tag = ref.tag if explicit_tag or not ref.digest else None
    host = _host(ref.repository) if ref.mirror is None else None
    if host is not None:
        if host not in registries and _hostname(host) not in registries:
            return None
        return Source(ref.repository, tag, ref.digest, _hostname(host) not in LOOPBACK_HOSTS)
    if not hub_mirror:
        return None
    mirror = hub_mirror.rstrip("/")
    path = ref.repository if "/" in ref.repository else f"library/{ref.repository}"
    return Source(f"{mirror}/{path}", tag, ref.digest, _hostname(mirror) not in LOOPBACK_HOSTS)


@dataclass(frozen=True)
class PulledImage:
    """An unpacked image in the cache."""

    source: str  # the docker:// reference it was pulled by (pinned to the digest)
    digest: str  # sha256:<hex> of the manifest (or index) the reference named
    rootfs: Path
    config: ImageConfig


class ImageStore:
    """Pulls and caches images by digest (``<cache>/images``). Safe across processes."""

    def __init__(self, root: Path | None = None, *, run: Runner = run_tool,
                 timeout_s: float = 600.0) -> None:
        self.root = root or cache_dir() / "images"
        self._run = run
        self.timeout_s = timeout_s

    def digest(self, source: Source) -> str:
        """The digest the reference names now (the pinned one, or the tag's manifest)."""
        if source.digest:
            return source.digest
        raw = self._tool("skopeo", "inspect", "--raw", *_tls(source, "--tls-verify"),
                         source.transport)
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    def pull(self, source: Source) -> PulledImage:
        """The image ``source`` names, from the cache or pulled; :class:`BuildError` if not."""
        digest = self.digest(source)
        target = self.root / digest.replace(":", "-")
        if not (target / "image.json").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / f".{target.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (target / "image.json").exists():
                    self._fetch(source, digest, target)
        return load(target)

    def _fetch(self, source: Source, digest: str, target: Path) -> None:
        tmp = self.root / f".tmp-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            layout = f"oci:{tmp / 'layout'}:image"
            self._tool("skopeo", "copy", "--quiet", *_tls(source, "--src-tls-verify"),
                       source.pinned(digest), layout)
            self._decompress_zstd(tmp / "layout")
            self._tool("umoci", "unpack", "--image", f"{tmp / 'layout'}:image", str(tmp / "bundle"))
            config = parse_config(config_blob(tmp / "layout"))
            (tmp / "bundle" / "rootfs").rename(tmp / "rootfs")
            shutil.rmtree(tmp / "bundle")
            shutil.rmtree(tmp / "layout")
            doc = {"source": source.pinned(digest), "digest": digest, "config": config.to_json()}
            (tmp / "image.json").write_text(json.dumps(doc, indent=1) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _decompress_zstd(self, layout: Path) -> None:
        """zstd layers -> plain tar layers in ``layout`` (umoci 0.4.7 reads gzip and plain tar
        only). A plain layer's digest is its diff_id, so the image config stays as it is."""
        index = json.loads((layout / "index.json").read_text())
        desc = index["manifests"][0]
        manifest = json.loads(_blob(layout, desc["digest"]))
        changed = False
        for layer in manifest.get("layers", []):
            if not str(layer.get("mediaType", "")).endswith("+zstd"):
                continue
            src = _blob_path(layout, layer["digest"])
            out = src.with_name(src.name + ".tar")
            self._tool("zstd", "-d", "-q", "-f", "-o", str(out), str(src))
            digest = _sha256_file(out)
            out.rename(_blob_path(layout, digest))
            layer.update(mediaType="application/vnd.oci.image.layer.v1.tar", digest=digest,
                         size=_blob_path(layout, digest).stat().st_size)
            changed = True
        if changed:
            data = json.dumps(manifest).encode()
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            _blob_path(layout, digest).write_bytes(data)
            desc.update(digest=digest, size=len(data))
            (layout / "index.json").write_text(json.dumps(index))

    def _tool(self, *argv: str) -> bytes:
        proc = self._run(argv, self.timeout_s)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            raise BuildError(f"{argv[0]} {argv[1]} {argv[-1] if argv[1] != 'copy' else argv[-2]} "
                             f"failed ({proc.returncode}): {err[-800:]}")
        return proc.stdout


def _tls(source: Source, flag: str) -> list[str]:
    return [] if source.tls_verify else [f"{flag}=false"]


def _blob_path(layout: Path, digest: str) -> Path:
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
        raise BuildError(f"unexpected blob digest in the image: {digest[:80]!r}")
    return layout / "blobs" / algo / hexd


def _blob(layout: Path, digest: str) -> bytes:
    return _blob_path(layout, digest).read_bytes()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def config_blob(layout: Path) -> bytes:
    """The config blob of the (one) image in an OCI layout."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]))
    return _blob(layout, manifest["config"]["digest"])


def load(target: Path) -> PulledImage:
    """A cached image directory -> :class:`PulledImage`."""
    doc = json.loads((target / "image.json").read_text())
    return PulledImage(doc["source"], doc["digest"], target / "rootfs",
                       ImageConfig.from_json(doc["config"]))
