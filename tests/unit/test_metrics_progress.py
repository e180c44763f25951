"""Plain progress lines when stderr is not a terminal, and the end-of-run summary."""

from __future__ import annotations

import io
import sys

import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.metrics.progress import (
    PlainProgress,
    ledger_line,
    progress_sink,
    run_summary_lines,
    wants_live,
)
from rollbank.scheduling.policy.events import AttemptFinished, BatchEvent, EventKind, GroupEvent


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def finished(t: float, reason: Reason) -> AttemptFinished:
    return AttemptFinished(kind=EventKind.FINISHED, t=t, attempt_id="g0/s0/r0", group_id="g0",
                           task_id="hello", slot=0, retry=0, seq=0,
                           outcome=EpisodeOutcome.of(reason, reward=1.0 if reason is Reason.VERIFIED_PASS else 0.0),
                           duration_s=1.0, model_tokens=5, total_tokens=50)


def test_non_tty_stream_gets_plain_progress_and_tty_gets_none_of_it() -> None:
    plain = io.StringIO()
    assert not plain.isatty()
    sink = progress_sink("auto", total_batches=1, groups_per_batch=2, stream=plain)
    assert isinstance(sink, PlainProgress)
    assert progress_sink("off", total_batches=1, groups_per_batch=2, stream=plain) is None
    assert wants_live("auto", TTY()) and not wants_live("auto", plain) and wants_live("on", plain)


def test_plain_lines_for_groups_batches_and_heartbeat() -> None:
    out = io.StringIO()
    wall = [0.0]
    p = PlainProgress(total_batches=1, groups_per_batch=2, stream=out, heartbeat_s=30.0,
                      wall=lambda: wall[0])
    p.server_ready(0, 123.4)
    p.emit(finished(10.0, Reason.VERIFIED_PASS))  # within the heartbeat period: silent
    wall[0] = 31.0
    p.emit(finished(12.0, Reason.VERIFIED_FAIL))
    for k, zero in enumerate((False, True)):
        p.emit(GroupEvent(kind=EventKind.GROUP_READY, t=20.0 + k, group_id=f"g{k}", task_id="hello",
                          seq=k, size=4, valid=4, zero_variance=zero))
    p.emit(BatchEvent(kind=EventKind.BATCH_READY, t=25.0, batch_index=0, groups=2, trajectories=8,
                      window_start=10.0))
    p.batch_written(0, "/tmp/out/batches/batch-000000", 15.2)
    lines = out.getvalue().splitlines()
    assert lines == [
        "[rollbank] server 0 ready in 123 s",
        "[rollbank] attempts finished 2 (model_failure 1, model_success 1) t=2s",
        "[rollbank] batch 0: groups 1/2 (task hello, 4/4 valid, reward variance) t=10s",
        "[rollbank] batch 0: groups 2/2 (task hello, 4/4 valid, zero variance) t=11s",
        "[rollbank] batch 0 ready (1 of 1): 2 groups, 8 trajectories t=15s",
        "[rollbank] batch 0 written to /tmp/out/batches/batch-000000 (time to batch 15 s)",
    ]


def test_run_summary_fits_one_screen_and_reports_learning_signal() -> None:
    batch = {"batch_index": 0, "n_groups": 4, "n_trajectories": 16, "time_to_batch_s": 95.123456789,
             "efficiency": 0.41234567, "tokens_per_s": 55.55555,
             "lower_bound": {"binding_term": "inference_work", "t_lb_s": 39.2},
             "outcomes": {"model_success": 5, "model_failure": 11},
             "extra": {"zero_variance_groups": 1, "zero_variance_share": 0.25}}
    lines = run_summary_lines([batch], out_dir="/tmp/run", setup_s=61.7, collection_s=95.1,
                              attempts=18, ledger={"launched": 18, "consumed": 16, "waste": 2})
    text = "\n".join(lines)
    assert len(lines) <= 24 and max(map(len, lines)) <= 120
    assert "time to batch 95 s, efficiency 0.41 (bound by inference_work), 55.6 tok/s" in text
    assert "3/4 groups with reward variance (75%); 1 zero-variance" in text
    assert "outcomes: model_failure 11, model_success 5" in text
    assert "set-up 62 s" in text and "/tmp/run/report.html" in text
    # one count of attempts, in the ledger's line (before: "18 attempts" on the set-up line too)
    assert text.count("attempts") == 1 and "attempts: 18 launched = 16 in batches" in text


def test_run_summary_reports_every_complete_group_and_the_held_ones() -> None:
    batch = {"batch_index": 0, "n_groups": 4, "n_trajectories": 16,
             "extra": {"zero_variance_groups": 0, "zero_variance_share": 0.0}}
    groups = {"dynamic_sampling": True, "groups_completed": 7, "zero_variance_completed": 3,
              "zero_variance_released": 0, "held_back": 3}
    text = "\n".join(run_summary_lines([batch], out_dir="/tmp/run", setup_s=1.0, collection_s=2.0,
                                       attempts=28, all_groups=groups))
    assert "4/4 groups with reward variance (100%)" in text  # the batch
    # the run: the zero-variance share among all complete groups stays visible
    assert "all complete groups: 4/7 with reward variance, 3 zero-variance (43%); " \
           "dynamic sampling released 0 of them into batches, 3 still held at the end" in text


def test_held_group_line_says_so() -> None:
    import io

    out = io.StringIO()
    p = PlainProgress(total_batches=1, groups_per_batch=2, stream=out)
    p.emit(GroupEvent(kind=EventKind.GROUP_READY, t=1.0, group_id="g0", task_id="hello", seq=0,
                      size=4, valid=4, zero_variance=True, held=True))
    p.emit(GroupEvent(kind=EventKind.GROUP_READY, t=2.0, group_id="g1", task_id="hello", seq=1,
                      size=4, valid=4, zero_variance=False))
    lines = out.getvalue().splitlines()
    assert "group of hello held back (4/4 valid, zero variance;" in lines[0]
    assert "groups 1/2 (task hello, 4/4 valid, reward variance)" in lines[1]  # held not counted


def test_no_stderr_or_a_closed_one_is_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: started with file descriptor 2 closed (``2>&-``, some daemon launchers)
    Python's ``sys.stderr`` is None and ``wants_live`` raised AttributeError; a closed stream
    raised ValueError. There is no view then, and nothing is written anywhere else."""
    closed = io.StringIO()
    closed.close()
    assert not wants_live("auto", closed) and not wants_live("auto", None)
    assert progress_sink("auto", total_batches=1, groups_per_batch=2, stream=closed) is None
    monkeypatch.setattr(sys, "stderr", None)
    assert progress_sink("auto", total_batches=1, groups_per_batch=2) is None
    assert progress_sink("on", total_batches=1, groups_per_batch=2) is None
    from rollbank.collect_config import CollectConfig
    from rollbank.collector import plain_printer

    assert plain_printer(CollectConfig()) is None  # print(file=None) would write to stdout


def test_one_batch_indexing_and_counts_that_agree() -> None:
    """Regression: the summary said "batch 0: 4 groups x 16 traj" (4 groups of 4) and the
    progress lines "batch 1/1" beside "batch 0 written": a batch is its 0-based index
    everywhere, and its size reads as groups and trajectories."""
    out = io.StringIO()
    p = PlainProgress(total_batches=2, groups_per_batch=1, stream=out)
    for i in range(2):
        p.emit(GroupEvent(kind=EventKind.GROUP_READY, t=1.0 + i, group_id=f"g{i}",
                          task_id="hello", seq=i, size=4, valid=4, zero_variance=False))
        p.emit(BatchEvent(kind=EventKind.BATCH_READY, t=2.0 + i, batch_index=i, groups=1,
                          trajectories=4, window_start=0.0))
        p.batch_written(i, f"/o/batches/batch-00000{i}", 2.0)
    text = out.getvalue()
    assert "batch 0: groups 1/1" in text and "batch 1: groups 1/1" in text
    assert "batch 0 ready (1 of 2)" in text and "batch 1 ready (2 of 2)" in text
    assert "/1" not in text.replace("groups 1/1", "")  # no 1-based "batch k/N"
    batch = {"batch_index": 0, "n_groups": 4, "n_trajectories": 16, "extra": {}}
    lines = run_summary_lines([batch], out_dir="/o", setup_s=1.0, collection_s=2.0, attempts=16)
    assert "  batch 0: 4 groups, 16 trajectories, time to batch" in "\n".join(lines)


def test_the_final_ledger_says_what_the_waste_is_and_leaves_out_empty_states() -> None:
    """Regression: "attempts: consumed 16, delivered 0, finished 0, ..., waste 16" right after a
    batch whose accounting said waste 0: the run's waste is what was still running or unused
    when the run ended (over-provisioned groups), and states that are 0 at the end are noise."""
    ledger = {"launched": 32, "in_flight": 0, "finished": 0, "delivered": 0, "consumed": 16,
              "retried": 0, "waste": 16, "unreachable": [],
              "waste_by_reason": {"unconsumed_at_close": 16}}
    assert ledger_line(ledger) == ("attempts: 32 launched = 16 in batches + 16 wasted "
                                   "(16 still running or unused when the run ended)")
    lines = run_summary_lines([], out_dir="/o", setup_s=1.0, collection_s=2.0, attempts=32,
                              ledger=ledger, interrupted="SIGINT")
    assert lines[0] == "run interrupted (SIGINT): 0 batch(es) written in /o"
