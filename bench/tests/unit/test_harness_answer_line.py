"""The answer-line harness: instruction as the prompt, one completion = one command, one turn."""

from __future__ import annotations

from pathlib import Path

from rollbank.collect_config import CollectConfig, make_harness_for
from rollbank.episodes.harnesses import (
    ActionKind,
    AnswerLineConfig,
    AnswerLineHarness,
    make_harness,
)
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.loader import load_task
from rollbank_bench.learning.task_folders import write_task
from rollbank_bench.learning.tasks import AdditionTask


def test_prompt_is_the_task_folders_instruction_as_the_bench_prompts_it(tmp_path: Path) -> None:
    task = AdditionTask(13, 7, 2)
    loaded = load_task(write_task(tmp_path, task))
    assert AnswerLineHarness().initial_prompt(loaded) == task.prompt == "Q: 13+7=? A:"


def test_completion_is_the_one_command_and_the_episode_ends() -> None:
    a = AnswerLineHarness().parse(" echo 20 > answer.txt\n")
    assert a.kind is ActionKind.DONE
    assert a.command_text == "echo 20 > answer.txt"


def test_empty_or_unusable_completion_ends_without_a_command() -> None:
    h = AnswerLineHarness()
    for text in ("", "  \n", "echo \0 > x", "bad \ud800"):
        a = h.parse(text)
        assert a.kind is ActionKind.DONE and a.commands == ()


def test_sampling_follows_the_config_and_stops_at_a_newline() -> None:
    sp = AnswerLineHarness(AnswerLineConfig(max_tokens=16, temperature=0.7)).sampling()
    assert (sp.max_tokens, sp.temperature, sp.stop) == (16, 0.7, ("\n",))


def test_observation_renders_the_results() -> None:
    r = ExecResult(exit_code=0, signal=None, stdout="hi\n", stderr="", duration_s=0.1)
    assert "hi" in AnswerLineHarness().format_observation([r])
    assert "[exit code 0]" in AnswerLineHarness().format_observation([r])


def test_selected_by_name_and_by_the_collect_config() -> None:
    assert make_harness("answer-line").name == "answer-line"
    cfg = CollectConfig.model_validate({"harness": "answer-line", "answer_line": {"max_tokens": 9}})
    h = make_harness_for(cfg)
    assert isinstance(h, AnswerLineHarness) and h.sampling().max_tokens == 9
