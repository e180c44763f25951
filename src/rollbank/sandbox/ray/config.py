"""Operator configuration of the Ray sandbox backend (``rollbank collect --ray auto|ADDRESS``).

Owns :class:`RaySandboxConfig`. Invariants: every field is documented and bounded; ``address``
None means the local backend (the embedded default); the sandboxes themselves are configured by
the ``sandbox.local`` section, which each node's host actor applies on its node.
"""

from __future__ import annotations

from pydantic import Field

from rollbank.config import Section


class RaySandboxConfig(Section):
    """Where the Ray cluster is and how sandboxes are placed on its CPU nodes."""

    address: str | None = Field(
        default=None,
        description="Ray cluster to run sandboxes on: 'auto' (the cluster this machine belongs "
        "to, or RAY_ADDRESS), an address such as 'HOST:6379' or 'ray://HOST:10001', or none "
        "(default: sandboxes run on this host with the local backend).",
    )
    resource: str = Field(
        default="sandbox_slots", min_length=1,
        description="Custom Ray resource that marks a CPU node for sandboxes: a node offering "
        "N units of it hosts one sandbox actor and N sandbox slots (start nodes with "
        "ray start --resources '{\"sandbox_slots\": N}').",
    )
    slots_per_node: int | None = Field(
        default=None, ge=1, le=100_000,
        description="Sandbox slots per node; none: the node's amount of the resource "
        "(rounded down). The scheduler's sandbox slots are the sum over live nodes.",
    )
    max_slots: int | None = Field(
        default=None, ge=1,
        description="Cap on the total sandbox slots taken from the cluster (none: no cap).",
    )
    node_poll_s: float = Field(
        default=1.0, gt=0, le=60,
        description="How often the node list is read from the cluster (joins and losses are "
        "seen within this period; a lost actor is seen at once by the calls to it).",
    )
    wait_for_nodes_s: float = Field(
        default=60.0, ge=0,
        description="At start, how long to wait for a first node offering the resource "
        "before failing with a sandbox error.",
    )
    actor_concurrency: int = Field(
        default=1000, ge=1,
        description="Calls one node's host actor runs at once (an exec holds one for its "
        "whole duration).",
    )
    ship_package: bool = Field(
        default=False,
        description="Upload this rollbank package to the cluster's workers (runtime_env "
        "py_modules) instead of using the rollbank installed on the nodes.",
    )
    namespace: str = Field(
        default="rollbank", description="Ray namespace of the host actors.",
    )
