"""Images as published (issue 26), on a REAL local registry and REAL sandboxes.

The fixture starts Debian's distribution registry (``docker-registry``) on 127.0.0.1 and
pushes a small image to it: a rootfs cut from the debootstrapped base (dash, a few coreutils
and the libraries they load, a user ``app``), packed with ``umoci`` into an OCI layout with
USER/WORKDIR/ENV/ENTRYPOINT/CMD in its config, and copied with ``skopeo``. The builder then
pulls it by tag and by digest (:mod:`rollbank.tasks.oci`) and a sandbox runs on it.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_registry import run as _run
from local_registry import serving

from rollbank.episodes.sandboxes import spec_for
from rollbank.errors import BuildError
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.protocol import SandboxSpec
from rollbank.tasks import oci
from rollbank.tasks.builder import BuiltEnvironment, EnvironmentBuilder
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.loader import load_task
from rollbank.tasks.model import Task

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures"
BINARIES = ("dash", "id", "pwd", "cat", "env", "ls", "stat", "touch", "mkdir", "whoami", "wc", "grep",
            "setpriv", "base64")  # setpriv: the USER switch; base64: the shell session framing


def _small_rootfs(base: Path, root: Path) -> None:
    """A few binaries of ``base`` and the libraries they load (merged /usr, as Debian 12)."""
    for d in ("usr/bin", "usr/lib", "usr/lib64", "etc", "home/app", "tmp", "root"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64"):
        (root / link).symlink_to(f"usr/{link}")
    libs: set[str] = set()
    for name in BINARIES:
        shutil.copy2(base / "usr/bin" / name, root / "usr/bin" / name)
        out = _run("chroot", str(base), "ldd", f"/usr/bin/{name}")
        libs |= {w for w in out.split() if w.startswith("/")}
    for lib in libs:
        rel = os.path.realpath(base / lib.lstrip("/")).removeprefix(str(base) + "/")
        want = "usr/" + lib.lstrip("/").removeprefix("usr/")
        (root / want).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(base / rel, root / want)
    (root / "usr/bin/sh").symlink_to("dash")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\napp:x:1000:\n")
    os.chown(root / "home/app", 1000, 1000)
    (root / "tmp").chmod(0o1777)


@dataclasses.dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:<port>
    digest: str  # sha256 of the pushed manifest
    index: str  # sha256 of a multi-arch index: the amd64 image above and an arm64 sibling


def _zstd(layout: Path, tag: str, new_tag: str) -> None:
    """``tag`` again as ``new_tag`` with its layers recompressed with zstd (same diff_ids)."""
    top = json.loads((layout / "index.json").read_text())
    desc = next(m for m in top["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    blobs = layout / "blobs/sha256"
    manifest = json.loads((blobs / desc["digest"][7:]).read_bytes())
    for layer in manifest["layers"]:
        data = zstd_bytes(gzip.decompress((blobs / layer["digest"][7:]).read_bytes()))
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        layer.update(mediaType="application/vnd.oci.image.layer.v1.tar+zstd", digest=f"sha256:{digest}",
                     size=len(data))
    data = json.dumps(manifest).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    top["manifests"].append({**desc, "digest": f"sha256:{digest}", "size": len(data),
                             "annotations": {"org.opencontainers.image.ref.name": new_tag}})
    (layout / "index.json").write_text(json.dumps(top))


def zstd_bytes(data: bytes) -> bytes:
    proc = subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True, timeout=60)
    return proc.stdout


def _multi_arch(layout: Path, tag: str, new_tag: str) -> str:
    """An image index in ``layout`` (tagged ``new_tag``): ``tag``'s manifest for this host's
    platform and an arm64 one (its config says arm64; same layers). Returns its digest."""
    def put(doc: dict[str, object]) -> tuple[str, int]:
        data = json.dumps(doc).encode()
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs/sha256" / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    def blob(digest: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((layout / "blobs/sha256" / digest.removeprefix("sha256:")).read_bytes())
        return doc
    top = json.loads((layout / "index.json").read_text())
    desc = next(m for m in top["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    manifest = blob(desc["digest"])
    amd_config = blob(manifest["config"]["digest"])
    arm_config = {**amd_config, "architecture": "arm64",  # its ENV tells which one was pulled
                  "config": {**amd_config["config"], "Env": ["GREETING=arm64", "PATH=/usr/bin:/bin"]}}
    cfg_digest, cfg_size = put(arm_config)
    arm = {**manifest, "config": {**manifest["config"], "digest": cfg_digest, "size": cfg_size}}
    arm_digest, arm_size = put(arm)
    plat = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": desc["mediaType"], "digest": desc["digest"], "size": desc["size"], "platform": plat},
        {"mediaType": desc["mediaType"], "digest": arm_digest, "size": arm_size,
         "platform": {"architecture": "arm64", "os": "linux"}}]}
    index_digest, index_size = put(index)
    top["manifests"].append({"mediaType": index["mediaType"], "digest": index_digest, "size": index_size,
                             "annotations": {"org.opencontainers.image.ref.name": new_tag}})
    (layout / "index.json").write_text(json.dumps(top))
    return index_digest


@pytest.fixture(scope="module")
def registry(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    work = tmp_path_factory.mktemp("oci")
    with serving(work) as host:
        layout = work / "layout"
        _run("umoci", "init", "--layout", str(layout))
        _run("umoci", "new", "--image", f"{layout}:small")
        _run("umoci", "unpack", "--image", f"{layout}:small", str(work / "bundle"))
        _small_rootfs(base, work / "bundle" / "rootfs")
        _run("umoci", "repack", "--image", f"{layout}:small", str(work / "bundle"))
        _run("umoci", "config", "--image", f"{layout}:small", "--config.user", "app",
             "--config.workingdir", "/home/app", "--config.env", "GREETING=hello from the image",
             "--config.env", "PATH=/usr/bin:/bin", "--config.entrypoint", "/bin/sh",
             "--config.cmd", "-c", "--config.cmd", "echo started")
        _run("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:small",
             f"docker://{host}/rollbank/small:1")
        raw = _run("skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{host}/rollbank/small:1")
        manifest = json.loads(raw)
        assert manifest["layers"], manifest
        digest = json.loads(_run("skopeo", "inspect", "--tls-verify=false",
                                 f"docker://{host}/rollbank/small:1"))["Digest"]
        # the same image under a Docker Hub name, as a mirror of Docker Hub serves it
        _run("skopeo", "copy", "--quiet", "--src-tls-verify=false", "--dest-tls-verify=false",
             f"docker://{host}/rollbank/small:1", f"docker://{host}/library/debian:bookworm-slim")
        _zstd(layout, "small", "zstd")
        _run("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:zstd",
             f"docker://{host}/rollbank/small:zstd")
        zstd_manifest = json.loads(_run("skopeo", "inspect", "--raw", "--tls-verify=false",
                                        f"docker://{host}/rollbank/small:zstd"))
        assert zstd_manifest["layers"][0]["mediaType"].endswith("+zstd"), zstd_manifest
        index = _multi_arch(layout, "small", "multi")
        _run("skopeo", "copy", "--quiet", "--all", "--dest-tls-verify=false", f"oci:{layout}:multi",
             f"docker://{host}/rollbank/small:multi")
        yield Registry(host, digest, index)


def _task(tmp_path: Path, image: str) -> Task:
    """A Harbor task with no Dockerfile: ``[environment] docker_image`` alone."""
    src = FIXTURES / "tasks" / "harbor-dockerfile-features"
    task = load_task(src)
    return dataclasses.replace(task, dockerfile=None, docker_image=image, workdir=None, env={},
                               path=tmp_path)


def _builder(tmp_path: Path, **config: object) -> EnvironmentBuilder:
    return EnvironmentBuilder(BuilderConfig(cache_root=str(tmp_path / "layers"),
                                            images_root=str(tmp_path / "images"), **config))  # type: ignore[arg-type]


async def _run_in(backend: LocalBackend, built: BuiltEnvironment, command: str) -> list[str]:
    sb = await backend.start(SandboxSpec(layers=built.layers, workdir=built.workdir, env=built.env))
    try:
        r = await sb.exec(command)
        assert r.exit_code == 0, r
        return r.stdout.splitlines()
    finally:
        await sb.close()


async def test_an_image_pulled_by_tag_and_by_digest_is_the_sandbox_base(
        registry: Registry, backend: LocalBackend, tmp_path: Path) -> None:
    builder = _builder(tmp_path)
    by_tag = await builder.build_async(_task(tmp_path, f"{registry.host}/rollbank/small:1"))
    assert by_tag.pulled == (f"docker://{registry.host}/rollbank/small@{registry.digest}",)
    assert by_tag.approximations == ()
    assert by_tag.user == "app" and by_tag.workdir == "/home/app"
    assert by_tag.env["GREETING"] == "hello from the image" and by_tag.env["PATH"] == "/usr/bin:/bin"
    assert by_tag.start_command() == ("/bin/sh", "-c", "echo started")
    rootfs = by_tag.layers[0]
    assert (rootfs / "usr/bin/dash").is_file() and not (rootfs / "usr/bin/python3").exists()
    assert rootfs.stat().st_uid == 0 and (rootfs / "home/app").stat().st_uid == 1000

    by_digest = await builder.build_async(_task(tmp_path, f"{registry.host}/rollbank/small@{registry.digest}"))
    assert by_digest.layers[0] == rootfs  # one cache entry per digest
    assert by_digest.layer_hashes[0] == registry.digest

    # the image's own files, WORKDIR and ENV; nothing of the Debian base (no /etc/os-release)
    lines = await _run_in(backend, by_digest, 'pwd; echo "$GREETING"; ls /usr/bin | wc -l; '
                          "test -e /etc/os-release || echo no-os-release; "
                          "grep -c ^app: /etc/passwd; touch /tmp/mine && echo wrote; stat -c %U:%u /home/app")
    assert lines == ["/home/app", "hello from the image", str(len(BINARIES) + 1), "no-os-release",
                     "1", "wrote", "app:1000"]  # the image's user owns its home (the full id range)


async def test_the_agents_shell_runs_as_the_pulled_images_user(
        registry: Registry, backend: LocalBackend, tmp_path: Path) -> None:
    task = _task(tmp_path, f"{registry.host}/rollbank/small:1")
    built = await _builder(tmp_path).build_async(task)
    spec = spec_for(task, built)
    assert spec.user == "app"  # the image config's USER reaches the sandbox spec
    sb = await backend.start(spec)
    (fork,) = await backend.fork(await sb.snapshot(), 1)
    try:
        for box in (sb, fork):  # a sibling forked from the snapshot keeps the user
            session = await box.shell()
            try:
                r = await session.run('id -un; id -u; id -g; echo "$HOME"; pwd; '
                                      "touch /home/app/by-agent && stat -c %U /home/app/by-agent; "
                                      "touch /root/x 2>/dev/null || echo denied")
            finally:
                await session.close()
            assert r.exit_code == 0, r
            assert r.stdout.splitlines() == ["app", "1000", "1000", "/home/app", "/home/app",
                                             "app", "denied"]
        # rollbank's own one-shot commands (runtime, verifier set-up) stay root
        r = await sb.exec("id -u; touch /root/x && echo root-wrote")
        assert r.stdout.splitlines() == ["0", "root-wrote"], r
    finally:
        await fork.close()
        await sb.close()


async def test_zstd_layers_are_unpacked(registry: Registry, backend: LocalBackend, tmp_path: Path) -> None:
    built = await _builder(tmp_path).build_async(_task(tmp_path, f"{registry.host}/rollbank/small:zstd"))
    assert built.pulled and built.layer_hashes[0] != registry.digest  # another manifest, same files
    assert await _run_in(backend, built, "echo $GREETING; ls /usr/bin | wc -l") == [
        "hello from the image", str(len(BINARIES) + 1)]


async def test_a_multi_arch_index_gives_this_hosts_image(registry: Registry, backend: LocalBackend,
                                                        tmp_path: Path) -> None:
    built = await _builder(tmp_path).build_async(_task(tmp_path, f"{registry.host}/rollbank/small:multi"))
    # cached under the index's digest (what the tag names), unpacked from the amd64 manifest
    assert built.pulled == (f"docker://{registry.host}/rollbank/small@{registry.index}",)
    assert built.layer_hashes[0] == registry.index != registry.digest
    assert json.loads((built.layers[0].parent / "image.json").read_text())["digest"] == registry.index
    assert await _run_in(backend, built, "echo $GREETING") == ["hello from the image"]


def test_a_wrong_digest_is_refused_and_an_unserved_image_falls_back(registry: Registry, tmp_path: Path) -> None:
    store = oci.ImageStore(tmp_path / "images")
    bad = oci.source_for(f"{registry.host}/rollbank/small@sha256:{'0' * 64}")
    assert bad is not None
    with pytest.raises(BuildError, match="skopeo copy"):
        store.pull(bad)
    assert not [p for p in (tmp_path / "images").iterdir() if not p.name.startswith(".")]
    # a Docker Hub name the mirror holds: pulled from it, the same digest, no approximation
    hub = _builder(tmp_path, hub_mirror=registry.host).build(
        _task(tmp_path, "docker.io/library/debian:bookworm-slim"))
    assert hub.pulled == (f"docker://{registry.host}/library/debian@{registry.digest}",)
    assert hub.approximations == () and hub.user == "app"
    # a Docker Hub name the mirror does not hold: the Debian recipe, with the reason reported
    built = _builder(tmp_path, hub_mirror=registry.host).build(_task(tmp_path, "ubuntu:24.04"))
    assert built.pulled == ()
    assert any(f"not pulled from {registry.host}/library/ubuntu" in a for a in built.approximations)


MULTI_STAGE = """\
FROM {host}/rollbank/small:1 AS build
USER root
RUN mkdir -p /out && echo "built in stage one as $(id -u)" > /out/artifact
FROM {host}/rollbank/small:1
COPY --from=build /out/artifact /opt/artifact
COPY --chown=1000:1000 data.txt /opt/data.txt
ENV STAGE=two
WORKDIR /opt
RUN id -un > /tmp/ran-as && cp /tmp/ran-as /opt/data-user 2>/dev/null || echo "as app: /opt not writable" > /tmp/note
USER root
RUN cat /opt/artifact > /opt/copy && cat /tmp/ran-as >> /opt/copy
USER app
HEALTHCHECK CMD cat /opt/copy
CMD ["cat", "/opt/copy"]
"""


async def test_a_multi_stage_dockerfile_builds_with_buildah(registry: Registry, backend: LocalBackend,
                                                            tmp_path: Path) -> None:
    task = _task(tmp_path, "")
    (tmp_path / "environment").mkdir()
    dockerfile = tmp_path / "environment" / "Dockerfile"
    dockerfile.write_text(MULTI_STAGE.format(host=registry.host))
    (tmp_path / "environment" / "data.txt").write_text("context file\n")
    task = dataclasses.replace(task, dockerfile=dockerfile, docker_image=None,
                               context_dir=tmp_path / "environment", content_hash="multi-stage-1")
    builder = _builder(tmp_path)
    built = await builder.build_async(task)
    assert built.builder == "buildah", built.notes
    assert built.pulled == (f"docker://{registry.host}/rollbank/small@{registry.digest}",)
    assert built.workdir == "/opt" and built.user == "app" and built.env["STAGE"] == "two"
    assert built.env["GREETING"] == "hello from the image" and built.cmd == ("cat", "/opt/copy")
    (rootfs,) = built.layers
    # stage one ran as root (USER root); stage two's first RUN as the image's USER, app
    assert (rootfs / "opt/copy").read_text() == "built in stage one as 0\napp\n"
    assert not (rootfs / "opt/data-user").exists() and (rootfs / "tmp/note").is_file()
    assert (rootfs / "opt/data.txt").stat().st_uid == 1000  # --chown: not in the interpreter
    assert not (rootfs / "out").exists()  # stage one's files stay in stage one
    again = await builder.build_async(task)
    assert again.cached and again.layers == built.layers
    lines = await _run_in(backend, built, "pwd; cat copy; echo $STAGE")
    assert lines == ["/opt", "built in stage one as 0", "app", "two"]


def test_buildah_is_not_chosen_for_bases_no_registry_serves(registry: Registry, tmp_path: Path) -> None:
    task = _task(tmp_path, "")
    (tmp_path / "environment").mkdir()
    dockerfile = tmp_path / "environment" / "Dockerfile"
    dockerfile.write_text(f"FROM {registry.host}/rollbank/small:1 AS a\nFROM ghcr.io/org/tool:1\n")
    task = dataclasses.replace(task, dockerfile=dockerfile, docker_image=None,
                               context_dir=tmp_path / "environment")
    with pytest.raises(BuildError, match=r"no configured registry serves ghcr\.io/org/tool:1"):
        _builder(tmp_path, builder="buildah").build(task)


async def test_the_interpreter_builds_over_a_pulled_base_with_its_config(
        registry: Registry, backend: LocalBackend, tmp_path: Path) -> None:
    task = _task(tmp_path, "")
    (tmp_path / "environment").mkdir()
    dockerfile = tmp_path / "environment" / "Dockerfile"
    dockerfile.write_text(f"FROM {registry.host}/rollbank/small:1\nUSER root\n"
                          "RUN mkdir -p /srv && echo \"$GREETING in $(pwd)\" > /srv/made\n"
                          'ENTRYPOINT ["/bin/sh", "-c"]\n')
    task = dataclasses.replace(task, dockerfile=dockerfile, docker_image=None,
                               context_dir=tmp_path / "environment")
    built = await _builder(tmp_path, builder="interpreter").build_async(task)
    assert built.builder == "interpreter"
    assert any("[builder] builder = interpreter" in n for n in built.notes), built.notes
    assert built.pulled == (f"docker://{registry.host}/rollbank/small@{registry.digest}",)
    # the image's WORKDIR and ENV were the RUN step's; USER root switched; ENTRYPOINT reset CMD
    assert built.workdir == "/home/app" and built.user is None
    assert built.entrypoint == ("/bin/sh", "-c") and built.cmd == ()
    assert await _run_in(backend, built, "cat /srv/made") == ["hello from the image in /home/app"]
