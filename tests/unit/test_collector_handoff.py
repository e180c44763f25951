"""Issue #8 defects 6 and 7 in the collector wiring, against fakes.

- 7: re-running into an existing output folder fails before the first launch (it failed
  only after a whole batch was collected, with a FileExistsError).
- 6: the collector acknowledges each batch by its directory once written, so the run's
  ledger consumes exactly the rows of the written batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.collect_config import CollectConfig, load_collect_config
from rollbank.collector import check_output_folder, collect
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.errors import InputError
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference_plane import InferencePlane
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool

TOK = FakeTokenizer()


def _model(req: GenerateRequest) -> str:
    slot = int(req.request_id.split("/s")[1].split("/")[0])
    if "\nOutput:" in TOK.decode(list(req.prompt_token_ids)).split("Task: Write hello")[-1]:
        return "DONE\n"
    return "```bash\necho hello > out.txt\n```\n" if slot % 2 == 0 else "DONE\n"


def _config() -> CollectConfig:
    return load_collect_config(None, {
        "inference.calibrate": False, "metrics.live": "off", "metrics.report": False,
        "task_order_seed": None, "scheduler.groups_per_batch": 1, "scheduler.pool_groups": 2,
        "scheduler.bank.group_size": 2, "scheduler.num_batches": 2,
        "scheduler.sandbox_slots": 4, "scheduler.inference_slots_per_server": 2,
    })


async def _run(out: Path) -> tuple[int, object]:
    """Collect into ``out``; return the number of generate requests served and the result."""
    served = 0

    def model(req: GenerateRequest) -> str:
        nonlocal served
        served += 1
        return _model(req)

    _, clients = make_fake_fleet(1, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        try:
            result = await collect(_config(), tasks=[make_task()], inference=plane,
                                   sandboxes=sandboxes, out_dir=out)
        except InputError as exc:
            return served, exc
    return served, result


async def test_rerunning_into_an_existing_output_folder_fails_before_any_launch(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    served, first = await _run(out)
    assert served > 0 and not isinstance(first, InputError)
    events_before = (out / "events.jsonl").read_bytes()
    served, second = await _run(out)
    assert isinstance(second, InputError)
    assert served == 0  # nothing was launched
    assert str(out) in str(second) and "batch-000000" in str(second)
    assert (out / "events.jsonl").read_bytes() == events_before  # the old run is intact


async def test_written_batches_are_acknowledged_and_consumed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _, result = await _run(out)
    assert not isinstance(result, InputError)
    summary = json.loads((out / "summary.json").read_text())
    rows = sum(b["n_trajectories"] for b in summary["batches"])
    led = summary["ledger"]
    assert rows == 4 and led["consumed"] == rows and led["delivered"] == 0
    assert led["launched"] == led["consumed"] + led["retried"] + led["waste"]
    assert led["unreachable"] == []


def test_output_folder_check(tmp_path: Path) -> None:
    check_output_folder(tmp_path / "new")  # absent: fine
    (tmp_path / "empty").mkdir()
    check_output_folder(tmp_path / "empty")  # empty: fine
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="file"):
        check_output_folder(tmp_path / "file")
    (tmp_path / "old" / "batches" / "batch-000000").mkdir(parents=True)
    with pytest.raises(InputError, match="already holds a run") as info:
        check_output_folder(tmp_path / "old")
    assert info.value.file == str(tmp_path / "old")
