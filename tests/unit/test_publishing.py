"""Unit tests of the publication patterns over fake engines: order, rollback, refusal,
measurement, compact diffs (the real-vLLM checks are in tests/integration/test_publishing_real.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollbank.clock import FakeClock
from rollbank.errors import (
    ConfigError,
    EngineDeadError,
    PublicationError,
    ServerUnreachableError,
    WeightMismatchError,
)
from rollbank.inference.protocol import AdmissionGate, PauseMode
from rollbank.inference.publishing import (
    ColocatedPublisher,
    DirectPublisher,
    Fleet,
    LoraPublisher,
    ServedWeights,
    WeightUpdate,
)
from rollbank.inference.publishing.shm import ShmLayout, map_file, views
from rollbank.inference.publishing.state import expand_fused

torch = pytest.importorskip("torch")


class FakeEngine:
    """One fake server: weights as a dict, a version label, a shared call log."""

    def __init__(self, url: str, log: list[str], clock: FakeClock | None = None) -> None:
        self._url = url
        self.log = log
        self.clock = clock
        self.version = 0
        self.weights: dict[str, Any] = {}
        self.fail_update = False
        self.dead = False
        self.gate: AdmissionGate | None = None
        self.paused = False
        self.loras: dict[str, str] = {}
        self.fail_lora = False
        self._pending: dict[str, Any] = {}
        self.bad_paths: set[str] = set()
        self.path = ""
        self.session = False
        self.staged: dict[str, Any] = {}
        self.prepared: list[bool] = []  # the stage phase's "prepare" flag, per publication

    def _call(self, what: str) -> None:
        if self.dead:
            raise ServerUnreachableError(f"{what}: connection refused", server=self._url)
        self.log.append(f"{what}:{self._url}")
        if self.clock is not None:
            self.clock.advance(0.01)

    @property
    def base_url(self) -> str:
        return self._url

    def set_admission(self, gate: AdmissionGate) -> None:
        self.gate = gate

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        assert self.gate is not None and not self.gate.is_open  # admission closed first
        self._call(f"pause-{mode}")
        self.paused = True

    async def resume(self) -> None:
        self._call("resume")
        self.paused = False

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None:
        self._call("reset-running" if reset_running_requests else "reset")

    async def engine_version(self, request_id: str | None = None) -> int:
        if self.dead:
            raise ServerUnreachableError("dead", server=self._url)
        return self.version

    # weight-sync routes
    async def init_weight_transfer_engine(self, init_info: Mapping[str, Any]) -> None:
        self._call("init")

    async def start_weight_update(self) -> None:
        # like rollbank_shm: starting a session touches no weight (allowed while generating)
        assert not self.session, "start_weight_update called while a weight update is already active"
        self._call("start")
        self.session = True
        self._pending = {}

    async def update_weights(self, update_info: Mapping[str, Any]) -> None:
        phase = update_info.get("extra", {}).get("phase", "load")
        self._call(f"update-{phase}")
        assert self.session
        layout = ShmLayout(update_info["names"], update_info["dtype_names"], update_info["shapes"],
                           update_info["offsets"], update_info["nbytes"])
        buf = map_file(Path(update_info["path"]), layout.nbytes, writable=False)
        got = {n: t.clone() for n, t in views(buf, layout)}
        if phase == "stage":
            self.staged = got
            self.prepared.append(bool(update_info["extra"].get("prepare", True)))
            return
        assert self.paused  # the weights change only while generation is stopped
        if self.fail_update:
            self.weights.update(dict(list(got.items())[:1]))  # half applied, then the engine dies
            self.dead = True
            self.session = False
            raise EngineDeadError("engine core died", server=self._url)
        if phase == "apply":
            self.weights.update(self.staged)
            self.staged = {}
        else:
            self._pending = got

    async def finish_weight_update(self, *, version: int | None) -> None:
        self._call("finish")
        if not self.session:
            raise EngineDeadError("finish_weight_update called without a matching start", server=self._url)
        self.session = False
        self.weights.update(self._pending)
        self._pending = {}
        if version is not None:
            self.version = version

    async def reload_weights(self, weights_path: str, *, version: int) -> None:
        self._call(f"reload-{Path(weights_path).name}")
        if weights_path in self.bad_paths:
            raise EngineDeadError("reload failed", server=self._url)
        self.path, self.version = weights_path, version

    # lora
    async def load_lora(self, name: str, path: str) -> None:
        self._call(f"load-{name}")
        if self.fail_lora:
            raise EngineDeadError("no", server=self._url)
        self.loras[name] = path

    async def unload_lora(self, name: str) -> None:
        self._call(f"unload-{name}")
        self.loras.pop(name, None)

    async def set_weight_version(self, version: int) -> None:
        self._call("label")
        self.version = version


def base_weights() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
             "model.layers.0.mlp.down_proj.weight"]
    return {n: torch.randn(4, 3, generator=g) for n in names}


def served_of(weights: dict[str, Any]) -> ServedWeights:
    served = ServedWeights({n: (tuple(t.shape), "float32") for n, t in weights.items()})
    served.commit(weights)
    return served


def fleet_of(n: int, tmp_path: Path, clock: FakeClock | None = None, **kw: Any) -> tuple[
        list[FakeEngine], list[str], DirectPublisher]:
    log: list[str] = []
    engines = [FakeEngine(f"s{i}", log, clock) for i in range(n)]
    base = base_weights()
    for e in engines:
        e.weights = dict(base)
    pub = DirectPublisher(engines, served_of(base), shm_dir=tmp_path, clock=clock, **kw)
    return engines, log, pub


async def test_direct_safe_order_compact_and_versions(tmp_path: Path) -> None:
    engines, log, pub = fleet_of(2, tmp_path, plan="pause")
    new = dict(base_weights())
    new["model.layers.0.self_attn.k_proj.weight"] = new["model.layers.0.self_attn.k_proj.weight"] + 1
    rec = await pub.publish(WeightUpdate(tensors=new), version=3)
    calls = [c.split(":")[0] for c in log]
    # staged while generating: the session opened and the buffer copied before the pause;
    # inside the pause only the apply (load + finalize) and the version label
    assert len(calls) == 18 and calls[:2] == ["init", "init"]
    assert sorted(calls[2:6]) == sorted(["start", "update-stage"] * 2)
    assert calls[6:8] == ["pause-keep", "pause-keep"]
    assert sorted(calls[8:12]) == sorted(["update-apply", "label"] * 2)
    assert calls[12:16] == ["reset-running", "reset-running", "resume", "resume"]  # frozen: recompute
    assert calls[16:] == ["finish", "finish"]  # the sessions end after the resume
    assert not any(e.session for e in engines)
    # k changed: the whole fused q/k/v parameter is sent, nothing else
    assert rec.tensors == 3 and rec.ok and rec.serving == {"s0": 3, "s1": 3}
    for e in engines:
        assert e.version == 3 and not e.paused
        assert torch.equal(e.weights["model.layers.0.self_attn.k_proj.weight"],
                           new["model.layers.0.self_attn.k_proj.weight"])
    assert pub.version == 3 and pub.fleet.gate.is_open
    assert [e.prepared for e in engines] == [[True], [True]]  # the worker reloads before the pause
    await pub.aclose()


async def test_direct_prepare_false_asks_only_for_the_buffer_copy(tmp_path: Path) -> None:
    engines, _, pub = fleet_of(1, tmp_path, plan="pause", prepare=False)
    rec = await pub.publish(WeightUpdate(tensors={n: t + 1 for n, t in base_weights().items()}), version=1)
    assert rec.ok and engines[0].prepared == [False] and engines[0].version == 1
    await pub.aclose()


async def test_direct_unstaged_order_keeps_every_route_inside_the_pause(tmp_path: Path) -> None:
    engines, log, pub = fleet_of(1, tmp_path, plan="finish", stage=False)
    new = {n: t + 1 for n, t in base_weights().items()}
    rec = await pub.publish(WeightUpdate(tensors=new), version=1)
    calls = [c.split(":")[0] for c in log]
    assert calls == ["init", "pause-wait", "finish", "start", "update-load", "finish", "reset", "resume"]
    assert rec.ok and set(rec.steps_s) >= {"start_route_s", "update_route_s", "finish_route_s"}
    assert all(torch.equal(engines[0].weights[n], new[n]) for n in new) and engines[0].version == 1
    await pub.aclose()


async def test_direct_failed_pause_after_staging_closes_the_sessions(tmp_path: Path) -> None:
    engines, _, pub = fleet_of(2, tmp_path)
    base = base_weights()

    async def refuse(mode: PauseMode = "wait", *, clear_cache: bool = True) -> None:
        raise EngineDeadError("pause refused", server="s1")

    engines[1].pause = refuse  # type: ignore[method-assign]
    with pytest.raises(PublicationError):
        await pub.publish(WeightUpdate(tensors={n: t + 1 for n, t in base.items()}), version=1)
    for e in engines:  # nothing applied, no session left open: the next publication may start
        assert not e.session and e.version == 0
        assert all(torch.equal(e.weights[n], base[n]) for n in base)
    await pub.aclose()


async def test_direct_engine_dies_halfway_rolls_back_the_others(tmp_path: Path) -> None:
    engines, _, pub = fleet_of(2, tmp_path)
    base = base_weights()
    new = {n: t + 1 for n, t in base.items()}
    engines[1].fail_update = True
    with pytest.raises(PublicationError) as info:
        await pub.publish(WeightUpdate(tensors=new), version=1)
    err = info.value
    # the survivor was rolled back to exactly the old weights and names the old version
    assert err.serving == {"s0": 0} and err.consistent
    assert all(torch.equal(engines[0].weights[n], base[n]) for n in base)
    rec = err.record
    assert rec is not None and not rec.ok and rec.lost == ("s1",)  # type: ignore[attr-defined]
    assert pub.version == 0 and pub.fleet.gate.is_open and not engines[0].paused
    # the trainer-side copy was not advanced: the next diff is against what is served
    assert torch.equal(pub.served.tensors["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    await pub.aclose()


async def test_mismatched_shapes_are_refused_before_any_pause(tmp_path: Path) -> None:
    _, log, pub = fleet_of(2, tmp_path)
    bad = dict(base_weights())
    bad["model.layers.0.mlp.down_proj.weight"] = torch.zeros(5, 3)
    with pytest.raises(WeightMismatchError) as info:
        await pub.publish(WeightUpdate(tensors=bad), version=1)
    assert "down_proj" in str(info.value) and info.value.serving == {"s0": 0, "s1": 0}
    unknown = {"model.layers.9.nope.weight": torch.zeros(4, 3)}
    with pytest.raises(WeightMismatchError):
        await pub.publish(WeightUpdate(tensors=unknown), version=1)
    assert log == []  # nothing paused, nothing sent
    await pub.aclose()


async def test_record_measures_publication_apart_from_pause(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    _, _, pub = fleet_of(1, tmp_path, clock=clock, compact=False)
    ready = clock.now()
    clock.advance(1.0)  # trainer step done 1 s before publish() is called
    rec = await pub.publish(WeightUpdate(tensors=base_weights()), version=1, ready_at=ready)
    # init, start, stage happen before pausing; then pause, apply, label, reset, resume
    assert rec.apply_pause_s == pytest.approx(0.05)
    assert rec.publication_s == pytest.approx(1.0 + 0.03 + 0.05)
    assert rec.tensors == 5 and rec.to_dict()["apply_pause_s"] == rec.apply_pause_s
    await pub.aclose()


async def test_fleet_pause_failure_touches_no_weights() -> None:
    log: list[str] = []
    engines = [FakeEngine("a", log), FakeEngine("b", log)]
    engines[1].dead = True
    applied: list[str] = []

    async def apply(c: Any) -> None:
        applied.append(c.base_url)

    with pytest.raises(PublicationError) as info:
        await Fleet(engines).publish(pattern="x", version=1, previous_version=0, ready_at=0.0,
                                     apply=apply, rollback=apply)
    assert applied == [] and info.value.serving == {"a": 0}
    assert "resume:a" in log and not engines[0].paused


def test_expand_fused_and_changed() -> None:
    names = ["l.0.self_attn.q_proj.weight", "l.0.self_attn.k_proj.weight",
             "l.0.self_attn.v_proj.weight", "l.0.mlp.gate_proj.weight", "l.0.mlp.up_proj.weight",
             "l.0.mlp.down_proj.weight"]
    assert expand_fused({"l.0.mlp.up_proj.weight"}, names) == {
        "l.0.mlp.gate_proj.weight", "l.0.mlp.up_proj.weight"}
    assert expand_fused({"l.0.mlp.down_proj.weight"}, names) == {"l.0.mlp.down_proj.weight"}
    base = base_weights()
    served = served_of(base)
    assert served.changed(base, compact=True) == {}
    assert len(served.changed(base, compact=False)) == 5


class FakeInProcess:
    def __init__(self, weights: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.weights = dict(weights)
        self.version = 0
        self.loads = 0
        self.fail_on_load = -1
        self.staged: list[tuple[str, Any]] | None = None
        self.fail_stage = False
        self.fail_swap = False
        self.holds = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self.lock:
            self.holds += 1
            yield

    def stage_weights(self, pairs: Sequence[tuple[str, Any]]) -> None:
        assert not self.lock.locked()  # prepared while the engine still generates
        if self.fail_stage:
            raise RuntimeError("staging failed")
        self.staged = list(pairs)

    def swap_staged(self) -> None:
        assert self.lock.locked() and self.staged is not None
        pairs, self.staged = self.staged, None
        for i, (n, t) in enumerate(pairs):
            if self.fail_swap and i == 1:
                raise RuntimeError("swap failed halfway")
            self.weights[n] = t

    def discard_staged(self) -> None:
        self.staged = None

    def load_weights(self, pairs: Sequence[tuple[str, Any]]) -> None:
        assert self.lock.locked()
        self.loads += 1
        for i, (n, t) in enumerate(pairs):
            if self.loads == self.fail_on_load and i == 1:
                raise RuntimeError("load failed halfway")
            self.weights[n] = t

    def set_version(self, version: int) -> None:
        self.version = version

    def engine_version(self) -> int:
        return self.version

    def reset_prefix_cache(self) -> bool:
        return True

    def abort_all(self) -> int:
        return 0


async def test_colocated_publish_and_rollback_on_a_failed_load() -> None:
    base = base_weights()
    eng = FakeInProcess(base)
    pub = ColocatedPublisher(eng, served_of(base), compact=False, stage=False)
    new = {n: t * 2 for n, t in base.items()}
    rec = await pub.publish(WeightUpdate(tensors=new), version=1)
    assert rec.ok and eng.version == 1 and torch.equal(eng.weights["model.embed_tokens.weight"],
                                                       new["model.embed_tokens.weight"])
    eng.fail_on_load = eng.loads + 1
    newer = {n: t * 3 for n, t in base.items()}
    with pytest.raises(PublicationError) as info:
        await pub.publish(WeightUpdate(tensors=newer), version=2)
    assert info.value.serving == {"colocated": 1} and eng.version == 1
    assert all(torch.equal(eng.weights[n], new[n]) for n in base)  # v1 weights, not a mix
    with pytest.raises(ConfigError):
        ColocatedPublisher(eng, served_of(base), plan="finish")


async def test_colocated_staged_update_is_prepared_outside_the_hold_and_swapped_inside() -> None:
    base = base_weights()
    eng = FakeInProcess(base)
    pub = ColocatedPublisher(eng, served_of(base), compact=False)
    new = {n: t * 2 for n, t in base.items()}
    rec = await pub.publish(WeightUpdate(tensors=new), version=1)
    assert rec.ok and eng.version == 1 and eng.loads == 0 and eng.staged is None
    assert all(torch.equal(eng.weights[n], new[n]) for n in base) and "stage_s" in rec.steps_s
    # a failed stage: nothing held, nothing touched
    eng.fail_stage = True
    with pytest.raises(PublicationError) as info:
        await pub.publish(WeightUpdate(tensors={n: t * 3 for n, t in base.items()}), version=2)
    assert info.value.serving == {"colocated": 1} and eng.holds == 1 and pub.version == 1
    assert all(torch.equal(eng.weights[n], new[n]) for n in base)
    # a swap failing halfway: rolled back to v1 by a reload of the previous values
    eng.fail_stage, eng.fail_swap = False, True
    with pytest.raises(PublicationError):
        await pub.publish(WeightUpdate(tensors={n: t * 4 for n, t in base.items()}), version=3)
    assert eng.version == 1 and eng.loads == 1
    assert all(torch.equal(eng.weights[n], new[n]) for n in base)


async def test_lora_failed_load_unloads_and_never_pauses(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    save_file({"x.lora_A.weight": torch.zeros(4, 3)}, str(adapter / "adapter_model.safetensors"))
    log: list[str] = []
    engines = [FakeEngine("a", log), FakeEngine("b", log)]
    pub = LoraPublisher(engines, max_rank=8)
    rec = await pub.publish(WeightUpdate(path=str(adapter), lora=True), version=1)
    assert pub.adapter == "policy-v1" and rec.ok and [e.version for e in engines] == [1, 1]
    assert log.index("load-policy-v1:a") < log.index("pause-wait:a")  # loaded before pausing
    # no prefix-cache reset in the pause: a new adapter's requests cannot hit older blocks
    assert not any(c.startswith("reset") for c in log) and rec.steps_s["cache_reset_skipped"] == 1
    log.clear()
    engines[1].fail_lora = True
    with pytest.raises(PublicationError):
        await pub.publish(WeightUpdate(path=str(adapter), lora=True), version=2)
    assert "unload-policy-v2:a" in log and not any(c.startswith("pause") for c in log)
    assert pub.adapter == "policy-v1" and [e.version for e in engines] == [1, 1]
    with pytest.raises(ConfigError):
        LoraPublisher(engines, plan="pause")


class AbortingEngine(FakeEngine):
    """A client whose requests in flight end only on a second abort (the first reached the
    engine before one of them was added, as happens on a real server)."""

    def __init__(self, url: str, log: list[str]) -> None:
        super().__init__(url, log)
        self.running = {"r1", "r2"}
        self.aborts = 0

    @property
    def inflight_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self.running))

    async def abort(self, request_id: str, *more: str) -> None:
        assert self.gate is not None and not self.gate.is_open  # admission closed first
        self._call("abort-" + ",".join((request_id, *more)))
        self.aborts += 1
        if self.aborts > 1:
            self.running.clear()

    async def set_weight_version(self, version: int) -> None:
        assert not self.running  # no request of the old adapter runs when the version changes
        await super().set_weight_version(version)


async def test_lora_abort_plan_aborts_the_requests_in_flight_without_pausing_the_engine(
        tmp_path: Path) -> None:
    from safetensors.torch import save_file

    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    save_file({"x.lora_A.weight": torch.zeros(4, 3)}, str(adapter / "adapter_model.safetensors"))
    log: list[str] = []
    engines = [AbortingEngine("a", log), AbortingEngine("b", log)]
    pub = LoraPublisher(engines, max_rank=8, plan="abort")
    rec = await pub.publish(WeightUpdate(path=str(adapter), lora=True), version=1)
    assert rec.ok and [e.version for e in engines] == [1, 1] and pub.fleet.gate.is_open
    mine = [c.removesuffix(":a") for c in log if c.endswith(":a")]
    assert mine == ["load-policy-v1", "abort-r1,r2", "abort-r1,r2", "label"]  # no pause, no resume
    assert LoraPublisher(engines, plan="finish").fleet.abort_only is False


async def test_direct_sends_everything_to_a_fleet_with_a_restarted_server(tmp_path: Path) -> None:
    engines, _, pub = fleet_of(2, tmp_path)
    base = base_weights()
    new = dict(base)
    new["model.embed_tokens.weight"] = new["model.embed_tokens.weight"] + 1
    assert (await pub.publish(WeightUpdate(tensors=new), version=1)).tensors == 1  # compact
    engines[1].version, engines[1].weights = 0, dict(base)  # restarted on the checkpoint
    newer = dict(new)
    newer["model.layers.0.mlp.down_proj.weight"] = newer["model.layers.0.mlp.down_proj.weight"] + 1
    rec = await pub.publish(WeightUpdate(tensors=newer), version=2)
    assert rec.tensors == 5 and rec.steps_s["drifted"] == 1.0
    assert all(torch.equal(engines[1].weights[n], newer[n]) for n in newer)  # no mix
    await pub.aclose()


async def test_a_failed_staging_write_is_refused_before_any_pause(tmp_path: Path) -> None:
    engines, log, pub = fleet_of(2, tmp_path / "missing-dir")  # the write fails like a full disk
    new = {n: t + 1 for n, t in base_weights().items()}
    with pytest.raises(PublicationError) as info:
        await pub.publish(WeightUpdate(tensors=new), version=1)
    assert info.value.serving == {"s0": 0, "s1": 0}
    assert not any(c.startswith(("pause", "start", "update")) for c in log)
    assert all(e.version == 0 for e in engines) and pub.version == 0


async def test_checkpoint_failed_reload_rolls_every_server_back(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from rollbank.inference.publishing import CheckpointPublisher

    base_dir = tmp_path / "base"
    base_dir.mkdir()
    save_file(base_weights(), str(base_dir / "model.safetensors"))
    log: list[str] = []
    engines = [FakeEngine("a", log), FakeEngine("b", log)]
    pub = CheckpointPublisher(engines, base_dir, root=tmp_path / "ckpts")
    rec = await pub.publish(WeightUpdate(tensors={n: t + 1 for n, t in base_weights().items()}), version=1)
    assert rec.ok and [e.path for e in engines] == [str(tmp_path / "ckpts" / "v1")] * 2
    engines[1].bad_paths.add(str(tmp_path / "ckpts" / "v2"))
    with pytest.raises(PublicationError) as info:
        await pub.publish(WeightUpdate(tensors={n: t + 2 for n, t in base_weights().items()}), version=2)
    assert info.value.serving == {"a": 1, "b": 1}  # both back on v1, reloaded from its directory
    assert [e.path for e in engines] == [str(tmp_path / "ckpts" / "v1")] * 2
    assert pub.version == 1 and "reload-v1:a" in log[log.index("reload-v2:a"):]
