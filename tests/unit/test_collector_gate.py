"""``rollbank collect`` with the staleness gate on (fakes): the gate's decisions reach the
events log, the written batch columns and summary.json; without a scorer that can score,
the configuration is refused before collecting."""

from __future__ import annotations

import json
from pathlib import Path

from episode_rig import FileVerifier, fake_spec, make_task
from test_collector import TOK, config, model

from rollbank.batching.loader import read_batch_dir
from rollbank.collect_config import CollectConfig
from rollbank.collector import collect
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.episodes.trajectory import Trajectory
from rollbank.errors import ConfigError
from rollbank.inference.fake import make_fake_fleet
from rollbank.inference_plane import InferencePlane
from rollbank.metrics.bound import Capacity
from rollbank.metrics.events import read_events
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.scheduling.drivers.scoring import FakeScorer


def gated_config() -> CollectConfig:
    cfg = config()
    staleness = cfg.staleness.model_copy(update={
        "collection": cfg.staleness.collection.model_copy(update={"enabled": True})})
    return cfg.model_copy(update={
        "staleness": staleness, "metrics": cfg.metrics.model_copy(update={"report": False})})


def stale_first_try(t: Trajectory) -> list[float]:
    """Slot 1's first attempt looks stale (0.5 nats lower on every model token)."""
    d = -0.5 if t.attempt == 1 and t.retry == 0 else 0.0
    return [lp + d if m else 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True)]


async def _collect(tmp_path: Path, cfg: CollectConfig, scorer: FakeScorer | None) -> Path:
    _, clients = make_fake_fleet(2, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    backend = FakeBackend(files={"/app/.keep": b""})
    async with WarmPool(backend) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        await collect(cfg, tasks=[make_task()], inference=plane, sandboxes=sandboxes,
                      out_dir=tmp_path / "run", capacity=Capacity(100.0, 400.0, 1000.0, 4000.0,
                                                                  sandbox_slots=4),
                      scorer=scorer)
    return tmp_path / "run"


async def test_collect_with_the_gate_records_its_decisions(tmp_path: Path) -> None:
    out = await _collect(tmp_path, gated_config(), FakeScorer(stale_first_try, version=5))
    events = read_events(out / "events.jsonl")
    gated = [e for e in events if e["kind"] == "gated"]
    assert {e["verdict"] for e in gated if e["slot"] == 1 and e["retry"] == 0} == {"retry"}
    assert {e["verdict"] for e in gated if e["retry"] == 1} == {"admit"}
    table = read_batch_dir(out / "batches" / "batch-000000")
    assert set(table.column("scorer_version").to_pylist()) == {5}
    assert set(table.column("gate_verdict").to_pylist()) == {"admit"}
    ids = table.column("trajectory_id").to_pylist()
    retries = dict(zip(ids, table.column("stale_retries").to_pylist(), strict=True))
    assert all(retries[i] == (1 if "/s1/" in i else 0) for i in ids)
    summary = json.loads((out / "summary.json").read_text())
    staleness = summary["batches"][0]["staleness"]
    # counts of the batch window: slot 1 of each of its two groups at least
    assert staleness["gate"]["retried"] >= 2 and staleness["gate"]["admitted"] >= 4
    assert staleness["rare_success_choice"]["keep_rare_success"] is True


async def test_the_engine_scorer_needs_engines_that_can_score(tmp_path: Path) -> None:
    refused: list[ConfigError] = []
    try:
        await _collect(tmp_path, gated_config(), None)  # fake clients cannot score
    except* ConfigError as group:
        refused = [e for e in group.exceptions if isinstance(e, ConfigError)]
    assert refused and refused[0].field == "staleness.collection.scorer"
    assert not list((tmp_path / "run").glob("batches/batch-*"))
