"""Configuration of the tasks layer (how environments are built)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollbank.config import Section


class BuilderConfig(Section):
    """How environments are built."""

    network: bool = Field(default=True, description="Let RUN steps reach the network (package registries).")
    cache_root: str | None = Field(default=None, description="Where layers are cached (default <ROLLBANK_CACHE>/layers).")
    pull: bool = Field(default=True, description="Pull FROM/docker_image references that a registry below serves "
                       "(skopeo + umoci, cached by digest); off: every base from the Debian recipes.")
    registries: list[str] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1", "[::1]"],
        description="Registry hosts (host or host:port) that references naming them are pulled from; "
                    "loopback ones over plain HTTP, others over verified TLS.")
    hub_mirror: str | None = Field(
        default=None, description="A registry (host:port) serving Docker Hub names, e.g. debian:bookworm as "
                                  "<mirror>/library/debian:bookworm; unset: Hub names use the Debian recipes.")
    builder: Literal["auto", "buildah", "interpreter"] = Field(
        default="auto", description="Who runs Dockerfiles: buildah (bud --isolation chroot) when every FROM is "
                                    "pullable (auto), always buildah, or rollbank's own interpreter.")
    images_root: str | None = Field(default=None, description="Where pulled images are cached (default <ROLLBANK_CACHE>/images).")


class LoaderConfig(Section):
    """Limits the task loaders enforce."""

    max_file_mb: float = Field(default=50.0, gt=0, description="Largest single file allowed in a task folder (MiB).")
    max_total_mb: float = Field(default=500.0, gt=0, description="Largest total size of a task folder (MiB).")
    max_text_kb: int = Field(default=1024, gt=0, description="Largest instruction / task.toml / task.yaml (KiB).")
