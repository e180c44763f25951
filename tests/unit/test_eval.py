"""`rollbank eval` against fakes: pass@k by hand, every attempt counted, timings, costs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.collect_config import load_collect_config
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.evaluation.passk import histogram_quantile, mean_pass_at_k, pass_at_k
from rollbank.evaluation.run import (
    EvalOptions,
    eval_config,
    evaluate,
    label_of,
    result_lines,
    table,
)
from rollbank.evaluation.timing import bucket_delta, merge_buckets, ttft_buckets
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference_plane import InferencePlane
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.scheduling.config import StragglerPolicy

TOK = FakeTokenizer()
SOLVE = "```bash\necho hello > out.txt\n```\n"
# group seq -> task (task_order_seed None: name order): which slots solve
SOLVERS = {0: {0}, 1: {0, 1, 2, 3}, 2: set()}  # task a: 1 of 4, task b: 4 of 4, task c: 0 of 4


def model(req: GenerateRequest) -> str:
    seq = int(req.request_id[1:6])
    slot = int(req.request_id.split("/s")[1].split("/")[0])
    if "\nOutput:" in TOK.decode(list(req.prompt_token_ids)).split("Task: Write hello")[-1]:
        return "DONE\n"
    return SOLVE if slot in SOLVERS[seq] else "DONE\n"


def test_pass_at_k_hand_values() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert mean_pass_at_k([(4, 1), (4, 4), (4, 0)], 2) == pytest.approx((0.5 + 1 + 0) / 3)
    assert mean_pass_at_k([(1, 1), (4, 0)], 2) == 0.0  # the task with n < k is left out
    assert mean_pass_at_k([(1, 1)], 2) is None
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_pass_at_k_is_monotone_in_k_and_c() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            vals = [pass_at_k(n, c, k) for k in range(1, n + 1)]
            assert all(0.0 <= v <= 1.0 for v in vals)
            assert vals == sorted(vals)
            assert vals[0] == pytest.approx(c / n)


def test_histogram_quantile_and_prometheus_deltas() -> None:
    text_before = ('vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2\n'
                   'vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 3\n'
                   'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 3\n')
    text_after = ('vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 7\n'
                  'vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 12\n'
                  'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 13\n')
    delta = bucket_delta(ttft_buckets(text_before), ttft_buckets(text_after))
    assert delta == [(0.1, 5.0), (0.5, 9.0), (math.inf, 10.0)]
    assert histogram_quantile(delta, 0.5) == 0.1  # rank 5 of 10
    assert histogram_quantile(delta, 0.9) == 0.5  # rank 9
    assert histogram_quantile(delta, 0.99) == math.inf  # in the overflow bucket
    assert histogram_quantile([(0.1, 0.0)], 0.5) is None
    assert merge_buckets([delta, delta])[0] == (0.1, 10.0)


def test_eval_config_counts_every_attempt() -> None:
    base = load_collect_config(None, {"inference.kind": "fake"})
    cfg = eval_config(base, attempts=5, num_tasks=3)
    s = cfg.scheduler
    assert (s.groups_per_batch, s.pool_groups, s.max_groups, s.num_batches) == (3, 3, 3, 1)
    assert s.straggler is StragglerPolicy.WAIT and s.bank.group_size == 5
    assert s.bank.max_retries == 0 and s.bank.min_valid == 1 and not s.bank.filter_zero_variance
    assert base.scheduler.bank.dynamic_sampling.enabled  # the collect default holds groups back
    assert not s.bank.dynamic_sampling.enabled  # eval counts every group
    assert not cfg.inference.calibrate
    managed = eval_config(load_collect_config(None, {}), attempts=2, num_tasks=1, model="tiny")
    assert managed.inference.managed.model == "tiny"
    with pytest.raises(Exception, match="managed"):
        eval_config(base, attempts=2, num_tasks=1, model="tiny")
    assert EvalOptions(attempts=4).k_values() == [1, 4]
    with pytest.raises(ValueError):
        EvalOptions(attempts=2, ks=[3])
    assert label_of("/ckpt/step-10/") == "step-10" and label_of("tiny") == "tiny"


async def test_eval_end_to_end_with_fakes(tmp_path: Path) -> None:
    tasks = [make_task(t) for t in ("a", "b", "c")]
    base = load_collect_config(None, {"inference.kind": "fake", "metrics.live": "off",
                                      "metrics.report": False})
    cfg = eval_config(base, attempts=4, num_tasks=3)
    _, clients = make_fake_fleet(2, responder=model, decode_s_per_token=0.0)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    backend = FakeBackend(files={"/app/.keep": b""})
    async with WarmPool(backend) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        row = await evaluate(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes,
                             out_dir=tmp_path / "run", ks=[1, 2, 4])
    assert row["attempts"] == 12 and row["launched"] == 12  # every attempt launched is counted
    assert row["per_task"] == {"a": {"n": 4, "successes": 1, "valid": 4, "solve_rate": 0.25},
                               "b": {"n": 4, "successes": 4, "valid": 4, "solve_rate": 1.0},
                               "c": {"n": 4, "successes": 0, "valid": 4, "solve_rate": 0.0}}
    assert row["pass_at"]["1"] == pytest.approx((0.25 + 1 + 0) / 3)
    assert row["pass_at"]["2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert row["pass_at"]["4"] == pytest.approx(2 / 3)
    assert row["outcomes"] == {"model_failure": 7, "model_success": 5}
    assert row["reasons"] == {"verified_fail": 7, "verified_pass": 5}
    assert row["ttft_s"]["source"] == "server_per_request" and row["ttft_s"]["n"] == row["requests"]
    assert row["requests"] >= 12 and row["tokens_per_s"]["n"] > 0
    assert row["engine_s_per_success"] == pytest.approx(row["engine_s"] / 5)
    assert row["sandbox_s"] > 0 and row["sandbox_s_per_success"] == pytest.approx(row["sandbox_s"] / 5)
    assert row["weight_versions"] == [0]
    on_disk = json.loads((tmp_path / "run" / "eval-row.json").read_text())
    assert on_disk["pass_at"] == row["pass_at"]
    assert "pass@2" in table({"ks": [1, 2, 4], "rows": [row]})


async def test_eval_writes_an_eval_result_not_a_training_batch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: eval wrote training Parquet (batches/) and printed "batch 0 written"."""
    tasks = [make_task(t) for t in ("a", "b", "c")]
    base = load_collect_config(None, {"inference.kind": "fake", "metrics.live": "auto",
                                      "metrics.report": False})
    cfg = eval_config(base, attempts=4, num_tasks=3)
    _, clients = make_fake_fleet(2, responder=model, decode_s_per_token=0.0)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        row = await evaluate(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes,
                             out_dir=tmp_path / "run", ks=[1], label="m")
    assert not (tmp_path / "run" / "batches").exists()  # no training batch
    assert (tmp_path / "run" / "eval-row.json").is_file()
    err = capsys.readouterr().err
    assert "written" not in err and "batch" not in err and "variance" not in err
    assert "[rollbank] eval: m: task a 1/4 solved (tasks" in err
    assert "task b 4/4 solved" in err and "task c 0/4 solved" in err
    lines = result_lines({"rows": [row]})
    assert [(r["task"], r["successes"], r["solve_rate"]) for r in lines] == [
        ("a", 1, 0.25), ("b", 4, 1.0), ("c", 0, 0.0)]
