"""Pure parts of the Ray backend: which nodes give how many slots, the spec's content key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.errors import SandboxDiedError, SandboxError, SandboxLostError
from rollbank.sandbox.protocol import Limits, SandboxSpec
from rollbank.sandbox.ray.backend import spec_key
from rollbank.sandbox.ray.cluster import slots_by_node


def _node(node_id: str, alive: bool = True, **res: float) -> dict[str, object]:
    return {"NodeID": node_id, "Alive": alive, "Resources": res}


def test_only_live_nodes_offering_the_resource_count() -> None:
    nodes = [_node("head", CPU=0.0), _node("w1", sandbox_slots=2.0, CPU=2.0),
             _node("w2", sandbox_slots=3.999999999999), _node("dead", False, sandbox_slots=8.0),
             _node("tiny", sandbox_slots=0.5), _node("other", gpu_slots=4.0)]
    assert slots_by_node(nodes, "sandbox_slots", None) == {"w1": 2, "w2": 4}
    assert slots_by_node(nodes, "sandbox_slots", 5) == {"w1": 5, "w2": 5, "tiny": 5}
    assert slots_by_node(nodes, "gpu_slots", None) == {"other": 4}
    assert slots_by_node([{"NodeID": "x", "Alive": True}], "sandbox_slots", None) == {}


def test_spec_key_is_a_content_hash() -> None:
    a = SandboxSpec(layers=(Path("/l/base"), Path("/l/t1")), env={"A": "1"}, label="t")
    assert spec_key(a) == spec_key(SandboxSpec(layers=(Path("/l/base"), Path("/l/t1")),
                                               env={"A": "1"}, label="t"))
    for other in (SandboxSpec(layers=(Path("/l/base"),), env={"A": "1"}, label="t"),
                  SandboxSpec(layers=a.layers, env={"A": "2"}, label="t"),
                  SandboxSpec(layers=a.layers, env={"A": "1"}, label="t",
                              limits=Limits(memory_mb=1)),
                  SandboxSpec(layers=a.layers, env={"A": "1"}, label="t", network=True)):
        assert spec_key(other) != spec_key(a)


class _Method:
    def __init__(self, outcome: object) -> None:
        self.outcome = outcome

    def remote(self, *args: object) -> object:
        async def reply() -> object:
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

        return reply()


class _Actor:
    """Stands for a Ray actor handle: ``actor.method.remote(...)`` is awaitable."""

    def __init__(self, **outcomes: object) -> None:
        for name, outcome in outcomes.items():
            setattr(self, name, _Method(outcome))


async def test_node_ref_translates_ray_errors() -> None:
    ray = pytest.importorskip("ray")
    from rollbank.sandbox.ray.cluster import NodeRef

    lost: list[str] = []
    inner = SandboxDiedError("no sandbox b1 on node 1234abcd (closed)")
    actor = _Actor(info={"ok": 1}, died=ray.exceptions.ActorDiedError(),
                   ours=ray.exceptions.RayTaskError("exec", "tb", inner).as_instanceof_cause(),
                   bug=ray.exceptions.RayTaskError("exec", "tb", KeyError("x")))
    node = NodeRef("1234abcd" + "0" * 48, actor, 2, lost.append)
    assert await node.call("info") == {"ok": 1}
    with pytest.raises(SandboxDiedError) as err:  # rollbank's own error, unwrapped
        await node.call("ours")
    assert err.value is inner and not lost
    with pytest.raises(SandboxError, match="KeyError") as err2:  # a host bug: a sandbox error
        await node.call("bug")
    assert not isinstance(err2.value, SandboxLostError) and not lost
    with pytest.raises(SandboxLostError, match="lost during died"):
        await node.call("died")
    assert lost == [node.node_id] and node.lost
    with pytest.raises(SandboxLostError):  # every later call: lost, reported once
        await node.call("info")
    assert lost == [node.node_id]
