"""The collector wiring against fakes: batches, events, episodes, summary, report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.batching.writer import ready_batches
from rollbank.collect_config import CollectConfig, load_collect_config
from rollbank.collector import collect
from rollbank.episodes.replay import episode_filename
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.errors import ConfigError
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference_plane import InferencePlane
from rollbank.metrics.bound import Capacity
from rollbank.metrics.events import read_events
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.task_selection import task_sequence

TOK = FakeTokenizer()
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def model(req: GenerateRequest) -> str:
    """Even slots solve the task, odd slots give up: every group has reward variance."""
    prompt = TOK.decode(list(req.prompt_token_ids))
    slot = int(req.request_id.split("/s")[1].split("/")[0])
    if "\nOutput:" in prompt.split("Task: Write hello")[-1]:
        return "DONE\n"
    return "```bash\necho hello > out.txt\n```\n" if slot % 2 == 0 else "DONE\n"


def config(**sched: object) -> CollectConfig:
    return load_collect_config(None, {
        "inference.calibrate": False, "metrics.live": "off", "task_order_seed": None,
        "scheduler.groups_per_batch": 2, "scheduler.pool_groups": 3,
        "scheduler.bank.group_size": 2, "scheduler.num_batches": 2,
        "scheduler.sandbox_slots": 4, "scheduler.inference_slots_per_server": 2,
        **{f"scheduler.{k}": v for k, v in sched.items()},
    })


def with_metrics(cfg: CollectConfig, **update: object) -> CollectConfig:
    return cfg.model_copy(update={"metrics": cfg.metrics.model_copy(update=update)})


async def test_collect_writes_batches_events_episodes_summary_and_report(tmp_path: Path) -> None:
    task = make_task()
    _, clients = make_fake_fleet(2, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    cap = Capacity(100.0, 400.0, 1000.0, 4000.0, sandbox_slots=4)
    backend = FakeBackend(files={"/app/.keep": b""})
    async with WarmPool(backend) as pool:
        sandboxes = SandboxPlane(
            WarmSource(pool, fake_spec(("L",))), FileVerifier())
        cfg = with_metrics(config(), report=HAVE_MATPLOTLIB)  # report.html: rollbank[report]
        result = await collect(cfg, tasks=[task], inference=plane, sandboxes=sandboxes,
                               out_dir=tmp_path / "run", capacity=cap)
    assert not backend.live
    out = tmp_path / "run"
    assert len(result.batches) == 2 and len(ready_batches(out / "batches")) == 2
    for b in result.batches:
        assert b.n_groups == 2 and b.n_trajectories == 4
        assert b.outcomes == {"model_success": 2, "model_failure": 2}
        assert b.lower_bound["t_lb_s"] > 0 and b.efficiency is not None
        assert b.extra["accounting"]["consumed"] == 4
    manifest = json.loads((out / "batches" / "batch-000000" / "manifest.json").read_text())
    assert manifest["extra"]["summary"]["batch_index"] == 0
    kinds = [e["kind"] for e in read_events(out / "events.jsonl")]
    assert kinds[0] == "collector.run_started" and kinds[-1] == "collector.run_finished"
    assert kinds.count("batch_ready") == 2 and kinds.count("collector.batch_written") == 2
    assert kinds.count("launched") == kinds.count("finished") + kinds.count("aborted")
    episodes = {p.name for p in (out / "episodes").glob("*.json")}
    # every returned trajectory has its episode file (an attempt aborted at close while its
    # file was being written may leave one more file than trajectories)
    assert {episode_filename(t.trajectory_id) for t in result.trajectories} <= episodes
    assert len(result.trajectories) >= 8
    summary = json.loads((out / "summary.json").read_text())
    led = summary["ledger"]
    assert led["launched"] == led["consumed"] + led["retried"] + led["waste"]
    assert led["in_flight"] == led["finished"] == 0
    if HAVE_MATPLOTLIB:
        assert (out / "report.html").read_text().count("data:image/png") == 5  # + attempts at a glance
    else:
        assert not (out / "report.html").exists()
    assert json.loads((out / "config.resolved.json").read_text())["scheduler"]["num_batches"] == 2


def test_default_config_is_valid_and_overridable() -> None:
    c = load_collect_config()
    assert c.inference.kind == "managed" and c.tasks == ["terminal-lite"]
    c2 = load_collect_config(None, {"scheduler.groups_per_batch": 3, "scheduler.pool_groups": 4})
    assert c2.scheduler.groups_per_batch == 3
    with pytest.raises(ConfigError, match="scheduler"):
        load_collect_config(None, {"scheduler.nonsense": 1})


def test_config_file_errors_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[runner]\nmax_turns = 0\n")
    with pytest.raises(ConfigError, match=r"c\.toml") as e:
        load_collect_config(p)
    assert e.value.field == "runner.max_turns"
    p.write_text("[runner\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_collect_config(p)


def test_task_sequence_is_a_seeded_permutation() -> None:
    tasks = [make_task(f"t{i}") for i in range(10)]
    a, b = task_sequence(tasks, 3), task_sequence(tasks, 3)
    assert a == b and sorted(a) == [f"t{i}" for i in range(10)]
    assert task_sequence(tasks, None) == sorted(a)
    assert task_sequence(tasks, 4) != a


def test_tasks_to_prepare_covers_the_first_groups_only() -> None:
    from rollbank.task_selection import tasks_to_prepare

    tasks = [make_task(f"t{i:02d}") for i in range(40)]
    cfg = load_collect_config(None, {"task_order_seed": None, "scheduler.groups_per_batch": 4,
                                     "scheduler.pool_groups": 6, "scheduler.num_batches": 2})
    prep = tasks_to_prepare(cfg, tasks)
    # pool 6 + one more batch of 4 + a batch of slack (requeues): the first 14 in sequence
    assert [t.task_id for t in prep] == [f"t{i:02d}" for i in range(14)]
    assert len(tasks_to_prepare(cfg, tasks[:5])) == 5


async def test_collect_writes_tensorboard_scalars_when_asked(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    _, clients = make_fake_fleet(2, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    cfg = with_metrics(config(num_batches=1), tensorboard=True, report=False,
                       record_episodes=False)
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        await collect(cfg, tasks=[make_task()], inference=plane, sandboxes=sandboxes,
                      out_dir=tmp_path / "run", capacity=Capacity(100.0, 400.0, 1000.0, 4000.0,
                                                                  sandbox_slots=4))
    [events_file] = (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*")
    data = events_file.read_bytes()
    assert b"batch/time_to_batch_s" in data and b"attempt/duration_s" in data


@pytest.mark.skipif(HAVE_MATPLOTLIB, reason="checks the error when rollbank[report] is missing")
async def test_report_without_its_extra_fails_before_collecting(tmp_path: Path) -> None:
    from rollbank.extras import MissingExtraError

    _, clients = make_fake_fleet(1, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        with pytest.raises(MissingExtraError, match=r"rollbank\[report\]"):
            await collect(with_metrics(config(), report=True), tasks=[make_task()],
                          inference=plane, sandboxes=sandboxes, out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
