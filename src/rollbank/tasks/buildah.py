"""The real image builder: ``buildah bud`` for Dockerfiles whose bases a registry serves.

Owns when buildah builds a task's Dockerfile (:func:`plan`) and the build itself
(:func:`build`); the rest of the builder (the verifier kit, skills, ``[environment] workdir``)
goes on over the result as over any base. Measured on this machine image (Debian 12,
buildah 1.28 run as root): ``buildah bud --isolation chroot`` with overlay storage builds a
multi-stage Dockerfile in ~2 s; it needs every ``FROM`` to be an image it can pull, so:

- ``[builder] builder = "auto"`` (default): buildah when it is installed and every ``FROM``
  is an earlier stage or a reference a configured registry serves (:func:`rollbank.tasks.oci.source_for`);
  otherwise rollbank's own interpreter over the Debian recipes. ``"buildah"``: buildah or a
  :class:`BuildError` saying why not; ``"interpreter"``: never buildah.
- Each ``FROM`` image is pinned to the digest resolved through :class:`rollbank.tasks.oci.ImageStore`
  (the Dockerfile buildah sees has ``FROM <registry>/<repo>@sha256:...``), so the result's key
  — the rewritten Dockerfile, the task folder's content hash, buildah's version — names
  exactly one build, cached as one layer (``<layers>/buildah-<key>``: the image's rootfs
  unpacked with umoci, its config beside it).
- Every instruction is buildah's: RUN (as the stage's USER), COPY/ADD (``--from``, ``--chown``,
  URLs), ENV, ARG, WORKDIR, USER, SHELL, ONBUILD, HEALTHCHECK... The build runs with the
  host's network (``--isolation chroot``) and the task's ``build_timeout_sec``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rollbank.errors import BuildError
from rollbank.tasks import dockerfile as df
from rollbank.tasks import oci
from rollbank.tasks.config import BuilderConfig

_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}


@dataclass(frozen=True)
class Plan:
    """A Dockerfile buildah can build: its text with every base ``FROM`` pinned by digest."""

    text: str
    sources: tuple[oci.Source, ...]  # the registries the bases come from
    pinned: tuple[str, ...]  # docker://<registry>/<repo>@<digest> of each base


@dataclass(frozen=True)
class Built:
    rootfs: Path
    config: oci.ImageConfig
    key: str
    cached: bool


def plan(instructions: list[df.Instruction], text: str, config: BuilderConfig, store: oci.ImageStore,
         *, file: Path, installed: bool | None = None) -> tuple[Plan | None, str]:
    """(the plan, "") when buildah builds this Dockerfile under ``config``, else (None, why not).
    ``installed``: whether buildah is (None: look it up on PATH)."""
    if config.builder == "interpreter":
        return None, "[builder] builder = interpreter"
    if installed is None:
        installed = shutil.which("buildah", path=_ENV["PATH"]) is not None
    if not installed:
        return None, "buildah is not installed"
    if not config.pull:
        return None, "[builder] pull = false"
    lines = text.splitlines()
    stages: set[str] = set()
    args: dict[str, str] = {}
    sources: list[oci.Source] = []
    pinned: list[str] = []
    for ins in instructions:
        if ins.keyword == "ARG" and not sources and not stages:
            for k, v in df.parse_key_values(ins.rest, keyword="ARG", file=file, line=ins.line):
                args[k] = df.substitute(v, args)
        if ins.keyword != "FROM":
            continue
        words = df.substitute(ins.rest, args).split()
        if not words:
            return None, f"line {ins.line}: empty FROM"
        image = words[0]
        if image.lower() not in stages and image != "scratch":
            source = oci.source_for(image, registries=config.registries, hub_mirror=config.hub_mirror)
            if source is None:
                return None, f"line {ins.line}: no configured registry serves {image}"
            try:
                digest = store.digest(source)
            except BuildError as exc:
                return None, f"line {ins.line}: {image} is not served ({str(exc)[:300]})"
            sources.append(source)
            pinned.append(source.pinned(digest))
            flags = "".join(f"--{k}={v} " for k, v in ins.flags)
            rest = " ".join([source.pinned(digest).removeprefix("docker://"), *words[1:]])
            if ins.line - 1 >= len(lines) or not lines[ins.line - 1].lstrip().upper().startswith("FROM"):
                return None, f"line {ins.line}: a FROM spread over lines"
            lines[ins.line - 1] = f"FROM {flags}{rest}"
        stages.add(str(len(stages)))
        if len(words) == 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
    return Plan("\n".join(lines) + "\n", tuple(sources), tuple(dict.fromkeys(pinned))), ""


def version() -> str:
    proc = subprocess.run(["buildah", "--version"], capture_output=True, text=True, check=False, env=_ENV)
    return proc.stdout.strip()


def build(p: Plan, *, context: Path, content_hash: str, layers_root: Path, timeout_s: float,
          store: oci.ImageStore) -> Built:
    """Build ``p`` with buildah (or find it cached) and unpack the image into a layer."""
    key = hashlib.sha256(json.dumps([p.text, content_hash, version()]).encode()).hexdigest()[:32]
    target = layers_root / f"buildah-{key}"
    if (target / "image.json").exists():
        return Built(target / "rootfs", _config(target), key, True)
    (layers_root / ".locks").mkdir(parents=True, exist_ok=True)
    with open(layers_root / ".locks" / f"buildah-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "image.json").exists():
            _build(p, context, key, target, timeout_s, store)
    return Built(target / "rootfs", _config(target), key, False)


def _config(target: Path) -> oci.ImageConfig:
    return oci.ImageConfig.from_json(json.loads((target / "image.json").read_text())["config"])


def _build(p: Plan, context: Path, key: str, target: Path, timeout_s: float, store: oci.ImageStore) -> None:
    storage = store.root.parent / "buildah"
    common = ["--storage-driver", "overlay", "--root", str(storage / "root"),
              "--runroot", str(storage / "run")]
    tmp = target.with_name(f".tmp-{os.getpid()}-{time.monotonic_ns()}")
    tmp.mkdir(parents=True)
    tag = f"localhost/rollbank-build:{key}"
    try:
        (tmp / "Dockerfile").write_text(p.text)
        plain = sorted({s.reference.split("/", 1)[0] for s in p.sources if not s.tls_verify})
        conf = "".join(f'[[registry]]\nlocation = "{host}"\ninsecure = true\n' for host in plain)
        (tmp / "registries.conf").write_text(conf)
        start = time.monotonic()
        _tool(["buildah", *common, "bud", "--isolation", "chroot", "--registries-conf",
               str(tmp / "registries.conf"), "--quiet", "-f", str(tmp / "Dockerfile"),
               "-t", tag, str(context)], timeout_s, "buildah bud")
        left = max(30.0, timeout_s - (time.monotonic() - start))
        try:
            _tool(["buildah", *common, "push", "--quiet", tag, f"oci:{tmp / 'layout'}:image"], left,
                  "buildah push")
        finally:
            subprocess.run(["buildah", *common, "rmi", "-f", tag], capture_output=True, check=False,
                           env=_ENV, timeout=120)
        _tool(["umoci", "unpack", "--image", f"{tmp / 'layout'}:image", str(tmp / "bundle")], left,
              "umoci unpack")
        config = oci.parse_config(oci.config_blob(tmp / "layout"))
        (tmp / "bundle" / "rootfs").rename(tmp / "rootfs")
        for d in ("bundle", "layout"):
            shutil.rmtree(tmp / d)
        (tmp / "image.json").write_text(json.dumps({"builder": version(), "config": config.to_json()},
                                                   indent=1) + "\n")
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tool(argv: list[str], timeout_s: float, what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=_ENV,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{what} timed out (build_timeout_sec {timeout_s:g}s)") from exc
    if proc.returncode != 0:
        raise BuildError(f"{what} failed ({proc.returncode}):\n{(proc.stderr or proc.stdout)[-2000:]}")
