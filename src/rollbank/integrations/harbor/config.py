"""Configuration of the rollbank Harbor environment (``--ek key=value`` on ``harbor run``).

Owns :class:`HarborProviderConfig`; Harbor passes its ``--ek`` pairs as keyword arguments to
the environment, which validates them here (unknown keys are errors, values are coerced from
the strings Harbor's command line gives).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from rollbank.config import Section


class HarborProviderConfig(Section):
    """How the rollbank environment builds and runs Harbor trials."""

    cache_root: str | None = Field(
        default=None, description="Where built layers are cached (default "
        "<ROLLBANK_CACHE>/layers, shared with `rollbank tasks validate` and `collect`).")
    build_network: bool = Field(
        default=True, description="Let Dockerfile RUN steps reach the package registries.")
    pin_verifier: bool = Field(
        default=True, description="Run the commands of Harbor's verifier phase (everything "
        "after the tests are uploaded to /tests) on the task's pristine toolchain (/usr and "
        "friends as built, rb-helper vexec), so an agent that replaced python or pytest does "
        "not grade itself. Off: the verifier sees the agent's filesystem as is.")
    verifier_shims: bool = Field(
        default=True, description="Put rollbank's offline verifier shims (uv/uvx, the curl "
        "uv installer, apt-get of packages already installed) first on the verifier phase's "
        "PATH, so test.sh scripts that download their test runner work without internet.")
    public_network: bool = Field(
        default=True, description="Give trials whose Harbor network policy is `public` (Harbor's "
        "default) the host's network. False: loopback only, as for `no-network` (tasks that "
        "need no internet at trial time; their verifier phase can then run pinned).")
    max_storage_mb: int = Field(
        default=4096, ge=16, description="Cap on a task's storage_mb (the writable layer is a "
        "tmpfs charged to the sandbox's memory).")
    registries: list[str] | None = Field(
        default=None, description="Registry hosts (host or host:port; comma-separated on "
        "the command line) that FROM lines and `docker_image` references naming them are "
        "pulled from (default: the builder's, the loopback hosts).")
    hub_mirror: str | None = Field(
        default=None, description="A registry (host:port) serving Docker Hub names "
        "(`debian:bookworm` as <mirror>/library/debian:bookworm); unset: Hub names are built "
        "from the Debian recipes and a `docker_image` task naming one is refused.")

    @field_validator("registries", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [h.strip() for h in value.split(",") if h.strip()]
        return value
