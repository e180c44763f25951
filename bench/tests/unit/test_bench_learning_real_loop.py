"""``rollbank bench learning --engine vllm``: the task folders, the held-out split and the
``rollbank train`` config it builds (the run itself: tests/integration/test_bench_learning_vllm.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from rollbank.tasks.loader import load_tasks
from rollbank.training.loop_config import load_train_config
from rollbank_bench.learning import command
from rollbank_bench.learning.real_loop import held_out_split, loop_overrides, steps_from_run
from rollbank_bench.learning.task_folders import folder_name, unique, write_suite, write_task
from rollbank_bench.learning.tasks import AdditionTask


def _verdict(tmp_path: Path, answer_file: str | None) -> str:
    """Run the task's test.sh with /app and /logs moved under tmp_path (host bash)."""
    d = write_task(tmp_path / "tasks", AdditionTask(13, 7, 2))
    root = tmp_path / "fs"
    (root / "app").mkdir(parents=True, exist_ok=True)
    if answer_file is not None:
        (root / "app" / "answer.txt").write_text(answer_file)
    script = (d / "tests" / "test.sh").read_text()
    script = script.replace("/app", str(root / "app")).replace("/logs", str(root / "logs"))
    subprocess.run(["bash", "-c", script], check=True, capture_output=True)
    return (root / "logs" / "verifier" / "reward.txt").read_text().strip()


@pytest.mark.parametrize(("content", "reward"), [
    ("20\n", "1"), (" 20 ", "1"), ("020", "1"), ("21\n", "0"), ("-20", "0"), ("2 0x", "0"),
    ("", "0"), (None, "0"),
])
def test_verifier_rewards_exactly_the_sum(tmp_path: Path, content: str | None, reward: str) -> None:
    assert _verdict(tmp_path, content) == reward


def test_suite_folders_load_as_tasks_once_each(tmp_path: Path) -> None:
    tasks = [AdditionTask(1, 2, 1), AdditionTask(1, 2, 1), AdditionTask(13, 7, 2)]
    suite = write_suite(tmp_path, "train", tasks)
    loaded = sorted(load_tasks([suite]), key=lambda t: t.task_id)
    assert [t.task_id for t in loaded] == ["add-l1-1-plus-2", "add-l2-13-plus-7"]
    assert [t.instruction.strip() for t in loaded] == ["Q: 1+2=? A:", "Q: 13+7=? A:"]
    assert write_suite(tmp_path, "train", tasks) == suite  # cached by content


def test_training_pool_holds_out_the_eval_set() -> None:
    held, pool = held_out_split((1, 2), eval_size=64, pool_size=100, seed=0)
    assert len(pool) == 100 and len(unique(pool)) == 100
    assert {folder_name(t) for t in held}.isdisjoint(folder_name(t) for t in pool)
    assert all(t.level in (1, 2) for t in held + pool)
    assert held_out_split((1, 2), 64, 100, 0) == (held, pool)  # deterministic


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.vllm_args(parser.parse_args(["--engine", "vllm", *extra]))


@pytest.mark.parametrize("extra", [
    (), ("--mode", "async", "--lag", "1", "--gated"), ("--publisher", "lora"),
    ("--publisher", "checkpoint"), ("--mode", "async", "--lag", "4", "--gated", "--correction", "m2po"),
])
def test_overrides_make_a_valid_train_config(tmp_path: Path, extra: tuple[str, ...]) -> None:
    args = _args("--steps", "3", "--prompts", "2", "--group-size", "4", *extra)
    cfg = load_train_config(None, loop_overrides(args, tmp_path / "m", tmp_path / "s", tmp_path / "o"))
    assert cfg.collect.harness == "answer-line" and cfg.collect.runner.max_turns == 1
    assert cfg.trainer.model == cfg.collect.inference.managed.model == str(tmp_path / "m")
    assert cfg.collect.scheduler.num_batches == cfg.loop.steps == 3
    assert cfg.collect.answer_line.temperature == cfg.trainer.temperature == 1.0
    assert cfg.collect.answer_line.max_tokens == 16
    assert cfg.loop.publisher == args.publisher and cfg.loop.mode == args.mode
    if args.gated:
        assert cfg.collect.staleness.collection.enabled
        assert cfg.trainer.correction.mode.value == args.correction
        assert cfg.trainer.ratio_against == "recompute" and cfg.loop.max_lag == args.lag
    if args.publisher == "lora":
        assert cfg.trainer.finetune == "lora" and cfg.collect.inference.managed.enable_lora


def test_steps_from_run_joins_publications_and_counts_stale(tmp_path: Path) -> None:
    recs = [
        {"kind": "step", "version": 1, "batch_index": 0, "reward_mean": 0.25, "policy_age": 0,
         "versions": {"0": 10}},
        {"kind": "publication", "version": 1, "publication_s": 0.5, "apply_pause_s": 0.1},
        {"kind": "stale", "batch_index": 1, "policy_age": 3},
        {"kind": "step", "version": 2, "batch_index": 2, "reward_mean": 0.5, "policy_age": 1,
         "versions": {"1": 10}},
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    steps, final, served, stale = steps_from_run(tmp_path)
    assert [s["version"] for s in steps] == [1, 2]
    assert (steps[0]["publication_s"], steps[0]["apply_pause_s"]) == (0.5, 0.1)
    assert steps[1]["publication_s"] is None  # version 2 was never served (the run stopped)
    assert (final, served, stale) == (2, 1, 1)


def test_answer_line_sampling_temperature_must_be_the_trainers() -> None:
    from rollbank.errors import ConfigError

    with pytest.raises(ConfigError, match=r"collect\.answer_line\.temperature"):
        load_train_config(None, {"collect.harness": "answer-line", "trainer.temperature": 1.0,
                                 "collect.answer_line.temperature": 0.5})
