"""rollbank.tasks.oci: which references are pulled, image configs, the digest cache (fake tools)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from rollbank.errors import BuildError
from rollbank.tasks import oci

DIGEST = "sha256:" + "ab" * 32


def test_loopback_registries_are_pulled_over_plain_http_others_not_at_all() -> None:
    src = oci.source_for("127.0.0.1:5000/team/img:1.2")
    assert src is not None and src.reference == "127.0.0.1:5000/team/img" and src.tag == "1.2"
    assert not src.tls_verify and src.transport == "docker://127.0.0.1:5000/team/img:1.2"
    assert oci.source_for("localhost:5000/img") == oci.Source("localhost:5000/img", "latest", None, False)
    assert oci.source_for("ghcr.io/org/img:1") is None  # not a configured registry
    assert oci.source_for("debian:bookworm") is None  # Docker Hub names need a mirror
    tls = oci.source_for("ghcr.io/org/img:1", registries=["ghcr.io"])
    assert tls is not None and tls.tls_verify


def test_a_pinned_digest_is_pulled_by_digest_and_hub_names_go_to_the_mirror() -> None:
    pinned = oci.source_for(f"127.0.0.1:5000/img@{DIGEST}")
    assert pinned is not None and pinned.tag is None and pinned.transport.endswith(f"/img@{DIGEST}")
    both = oci.source_for(f"127.0.0.1:5000/img:3@{DIGEST}")
    assert both is not None and both.tag == "3" and both.digest == DIGEST
    hub = oci.source_for("docker.io/library/python:3.11-slim", hub_mirror="127.0.0.1:5000")
    assert hub is not None and hub.transport == "docker://127.0.0.1:5000/library/python:3.11-slim"
    org = oci.source_for("bitnami/redis:7", hub_mirror="127.0.0.1:5000/")
    assert org is not None and org.reference == "127.0.0.1:5000/bitnami/redis"


def test_image_config_as_docker_reads_it() -> None:
    blob = json.dumps({"architecture": "amd64", "config": {
        "User": "app", "WorkingDir": "/srv", "Env": ["PATH=/usr/bin", "A=b=c", "EMPTY="],
        "Entrypoint": ["/entry.sh"], "Cmd": ["serve", "--port", "80"]}}).encode()
    cfg = oci.parse_config(blob)
    assert cfg == oci.ImageConfig("app", "/srv", {"PATH": "/usr/bin", "A": "b=c", "EMPTY": ""},
                                  ("/entry.sh",), ("serve", "--port", "80"))
    assert oci.ImageConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    assert oci.parse_config(b'{"config": {"User": "0:0"}}').user is None
    assert oci.parse_config(b"{}") == oci.ImageConfig()
    with pytest.raises(BuildError, match="not JSON"):
        oci.parse_config(b"{")


class FakeTools:
    """skopeo/umoci stand-ins: a manifest for inspect, an OCI layout for copy, a rootfs for unpack."""

    def __init__(self, manifest: bytes, fail: str | None = None) -> None:
        self.manifest = manifest
        self.fail = fail
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        argv = list(argv)
        self.calls.append(argv)
        if self.fail and argv[1] == self.fail:
            return subprocess.CompletedProcess(argv, 1, b"", b"manifest unknown")
        if argv[1] == "inspect":
            return subprocess.CompletedProcess(argv, 0, self.manifest, b"")
        if argv[1] == "copy":
            layout = Path(argv[-1].split(":")[1])
            config = json.dumps({"config": {"User": "app", "Env": ["X=1"]}}).encode()
            cfg_digest = hashlib.sha256(config).hexdigest()
            manifest = json.dumps({"config": {"digest": f"sha256:{cfg_digest}"}}).encode()
            man_digest = hashlib.sha256(manifest).hexdigest()
            (layout / "blobs/sha256").mkdir(parents=True)
            (layout / "blobs/sha256" / cfg_digest).write_bytes(config)
            (layout / "blobs/sha256" / man_digest).write_bytes(manifest)
            (layout / "index.json").write_text(json.dumps({"manifests": [{"digest": f"sha256:{man_digest}"}]}))
        if argv[1] == "unpack":
            (Path(argv[-1]) / "rootfs/etc").mkdir(parents=True)
        return subprocess.CompletedProcess(argv, 0, b"", b"")


def test_a_tag_is_resolved_to_its_digest_and_a_cached_digest_is_not_pulled_again(tmp_path: Path) -> None:
    tools = FakeTools(b'{"schemaVersion": 2}')
    store = oci.ImageStore(tmp_path, run=tools)
    src = oci.source_for("127.0.0.1:5000/img:1")
    assert src is not None
    pulled = store.pull(src)
    want = "sha256:" + hashlib.sha256(b'{"schemaVersion": 2}').hexdigest()
    assert pulled.digest == want and pulled.source == f"docker://127.0.0.1:5000/img@{want}"
    assert pulled.rootfs == tmp_path / want.replace(":", "-") / "rootfs" and (pulled.rootfs / "etc").is_dir()
    assert pulled.config.user == "app" and pulled.config.env == {"X": "1"}
    copy = next(c for c in tools.calls if c[1] == "copy")
    assert "--src-tls-verify=false" in copy and copy[-2] == pulled.source  # pinned to the digest
    tools.calls.clear()
    assert store.pull(src) == pulled
    assert [c[1] for c in tools.calls] == ["inspect"]  # the tag is looked up, nothing copied
    pinned = oci.source_for(f"127.0.0.1:5000/img@{want}")
    assert pinned is not None
    tools.calls.clear()
    assert store.pull(pinned) == pulled and tools.calls == []


def test_a_failed_pull_names_the_tool_and_leaves_nothing(tmp_path: Path) -> None:
    store = oci.ImageStore(tmp_path, run=FakeTools(b"{}", fail="copy"))
    src = oci.source_for("127.0.0.1:5000/img:1")
    assert src is not None
    with pytest.raises(BuildError, match=r"skopeo copy .*manifest unknown"):
        store.pull(src)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_buildah_gets_the_dockerfile_with_every_base_pinned_by_digest(tmp_path: Path) -> None:
    from rollbank.tasks import buildah
    from rollbank.tasks import dockerfile as df
    from rollbank.tasks.config import BuilderConfig

    text = ("ARG BASE=127.0.0.1:5000/img:1\nFROM --platform=linux/amd64 ${BASE} AS build\n"
            "RUN true\nFROM build AS again\nFROM 127.0.0.1:5000/img:1\nCOPY --from=build /a /a\n")
    file = tmp_path / "Dockerfile"
    file.write_text(text)
    store = oci.ImageStore(tmp_path / "images", run=FakeTools(b"{}"))
    digest = "sha256:" + hashlib.sha256(b"{}").hexdigest()
    p, why = buildah.plan(df.parse_file(file), text, BuilderConfig(), store, file=file, installed=True)
    assert p is not None and why == ""
    assert p.text.splitlines() == [
        "ARG BASE=127.0.0.1:5000/img:1", f"FROM --platform=linux/amd64 127.0.0.1:5000/img@{digest} AS build",
        "RUN true", "FROM build AS again", f"FROM 127.0.0.1:5000/img@{digest}", "COPY --from=build /a /a"]
    assert p.pinned == (f"docker://127.0.0.1:5000/img@{digest}",)
    hub = "FROM python:3.12-slim\n"
    file.write_text(hub)
    assert buildah.plan(df.parse_file(file), hub, BuilderConfig(), store, file=file, installed=True) == (
        None, "line 1: no configured registry serves python:3.12-slim")
    assert buildah.plan(df.parse_file(file), hub, BuilderConfig(builder="interpreter"), store,
                        file=file, installed=True)[1] == "[builder] builder = interpreter"
    assert buildah.plan(df.parse_file(file), hub, BuilderConfig(), store, file=file,
                        installed=False)[1] == "buildah is not installed"
