"""The HTML report: self-contained, with the four plots and the batch tables."""

from __future__ import annotations

import base64
import importlib.util
import re
from pathlib import Path

import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.spans import Span, add_span
from rollbank.episodes.trajectory import Trajectory
from rollbank.extras import MissingExtraError
from rollbank.metrics.bound import Capacity
from rollbank.metrics.report import (
    _lanes,
    fmt_cell,
    fmt_number,
    headline,
    server_rows,
    write_report,
)
from rollbank.metrics.summary import summarize_batch

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="needs rollbank[report]")


def traj(i: int, start: float, end: float) -> Trajectory:
    t = Trajectory(trajectory_id=f"g{i // 2}/s{i % 2}/r0", group_id=f"g{i // 2}", task_id="x",
                   attempt=i % 2, launched_at=start, finished_at=end)
    add_span(t, Span("sandbox_setup", start, start + 0.1, t.trajectory_id, sandbox=f"sb{i}"))
    add_span(t, Span("inference", start + 0.1, start + 1, t.trajectory_id, server=f"s{i % 2}",
                     prompt_tokens=10, cached_tokens=0, gen_tokens=5))
    add_span(t, Span("exec", start + 1, end - 0.2, t.trajectory_id, sandbox=f"sb{i}"))
    add_span(t, Span("verify", end - 0.2, end, t.trajectory_id, sandbox=f"sb{i}"))
    add_span(t, Span("episode", start, end, t.trajectory_id, sandbox=f"sb{i}"))
    t.outcome = EpisodeOutcome.of(Reason.VERIFIED_FAIL, reward=0.0)
    return t


def test_lanes_pack_non_overlapping_intervals() -> None:
    a, b, c = traj(0, 0, 2), traj(1, 1, 3), traj(2, 2, 4)
    assert _lanes([(0, 2, a), (1, 3, b), (2, 4, c)]) == [0, 1, 0]


@needs_matplotlib
def test_report_is_self_contained_with_plots(tmp_path: Path) -> None:
    trajs = [traj(i, 0.5 * i, 0.5 * i + 3) for i in range(6)]
    events = [{"kind": "group_ready", "t": 3.0 + g} for g in range(3)]
    events.append({"kind": "batch_ready", "t": 5.5, "groups": 3})
    cap = Capacity(10, 40, 100, 400, sandbox_slots=4)
    s = summarize_batch(0, trajs, t_start=0.0, t_end=5.5, seen=trajs, capacity=cap,
                        servers=["s0", "s1"])
    path = write_report(tmp_path / "report.html", title="test run", trajectories=trajs,
                        events=events, batches=[s.to_dict()], config={"a": 1},
                        notes=["a note <b>escaped</b>"])
    html = path.read_text()
    imgs = html.count("data:image/png;base64,")
    assert imgs == 5  # attempts at a glance, two timelines, durations, ready bank
    for name in ("Timeline per inference server", "Timeline per sandbox", "Trajectory durations",
                 "Ready bank", "critical_path_s", "time_to_batch_s"):
        assert name in html
    assert "&lt;b&gt;escaped" in html
    first = html.split("data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(first)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in html and "src='/" not in html  # nothing external


@needs_matplotlib
def test_report_without_trajectories_still_renders(tmp_path: Path) -> None:
    path = write_report(tmp_path / "r.html", title="empty", trajectories=[], events=[], batches=[])
    assert path.read_text().count("data:image/png;base64,") == 1  # the ready bank


@pytest.mark.skipif(HAVE_MATPLOTLIB, reason="checks the error when rollbank[report] is missing")
def test_report_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'rollbank\[report\]'"):
        write_report(tmp_path / "r.html", title="t", trajectories=[traj(0, 0.0, 3.0)],
                     events=[], batches=[], config={})


def test_lanes_follow_start_order_whatever_the_input_order() -> None:
    # input not sorted by start: packing must still never put overlapping intervals together
    ivs = [(2.0, 4.0, None), (0.0, 3.0, None), (3.5, 5.0, None)]
    lanes = _lanes(ivs)
    for i, (a, b, _) in enumerate(ivs):
        for j, (c, d, _) in enumerate(ivs):
            if i < j and a < d and c < b:
                assert lanes[i] != lanes[j]
    assert lanes == [1, 0, 0]


def test_concurrent_requests_on_one_server_get_their_own_sub_lanes() -> None:
    spans = [Span("inference", 0.0, 2.0, "a", server="s0"), Span("inference", 1.0, 3.0, "b", server="s0"),
             Span("inference", 2.5, 4.0, "c", server="s0"), Span("inference", 0.0, 1.0, "d", server="s1")]
    servers, placed = server_rows(spans)
    assert servers == ["s0", "s1"]
    pos = {s.trajectory_id: (y, h) for s, y, h in placed}
    assert pos["a"][0] != pos["b"][0]  # overlapping: stacked, not drawn on top of each other
    assert pos["c"][0] == pos["a"][0]  # a ended before c started: lane reused
    for s, y, h in placed:  # every bar stays inside its server's band
        band = servers.index(s.server or "?")
        assert band - 0.5 <= y - h / 2 and y + h / 2 <= band + 0.5
    assert pos["d"][1] > pos["a"][1]  # a server with one lane gets a full-height bar


def test_numbers_are_formatted_for_people() -> None:
    assert fmt_number(0.123456789012345) == "0.123"
    assert fmt_number(95.123456789) == "95.1"
    assert fmt_number(1234.5678) == "1235"
    assert fmt_number(3.0) == "3"
    assert fmt_cell({"x": 0.333333333333333, "n": 2}) == "{&quot;n&quot;: 2, &quot;x&quot;: 0.333}"
    assert fmt_cell(None) == "-"


@needs_matplotlib
def test_report_has_a_headline_and_no_long_floats(tmp_path: Path) -> None:
    trajs = [traj(i, 0.37 * i, 0.37 * i + 3.1234567) for i in range(6)]
    trajs[0].outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=1.0)
    cap = Capacity(10, 40, 100, 400, sandbox_slots=4)
    s = summarize_batch(0, trajs, t_start=0.0, t_end=5.123456789, seen=trajs, capacity=cap,
                        servers=["s0", "s1"], extra={"zero_variance_groups": 2})
    rows = dict(headline([s.to_dict()], trajs, setup_s=61.23456))
    assert rows["time to batch"] == "#0 5.12 s; set-up before the clock 61.2 s"
    assert "bound by" in rows["efficiency T_LB / T"]
    assert rows["outcomes in batches"] == "6 trajectories: model_failure 5 (83%), model_success 1 (17%)"
    assert rows["reward variance"] == "1/3 groups with reward variance (33%); 2 zero-variance"
    assert "waiting for the model" in rows["where time went"] and "verifier" in rows["where time went"]
    path = write_report(tmp_path / "r.html", title="t", trajectories=trajs, events=[],
                        batches=[s.to_dict()], setup_s=61.2)
    page = path.read_text()
    assert page.index("class='headline'") < page.index("<h2>Batches</h2>")
    text_part = page.split("<h2>Timeline")[0]
    assert not re.search(r"\d\.\d{6,}", text_part)  # no 15-digit reprs anywhere in the tables


@needs_matplotlib
def test_report_reads_as_a_person_reads_it(tmp_path: Path) -> None:
    """Regression (issue: the report): outcomes were a raw JSON dict in the batch table, nothing
    said how many attempts were accepted or wasted, the timelines had no legend and no mark of
    the hand-off or the straggler tail, and half the page was the raw config."""
    from rollbank.metrics.report_plots import batch_marks

    trajs = [traj(i, 0.5 * i, 0.5 * i + 3) for i in range(6)]
    trajs[0].outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=1.0)
    cap = Capacity(10, 40, 100, 400, sandbox_slots=4)
    s = summarize_batch(0, trajs[:4], t_start=0.0, t_end=5.0, seen=trajs, capacity=cap,
                        servers=["s0", "s1"],
                        extra={"accounting": {"launched": 6, "consumed": 4, "retried": 0,
                                              "waste": 0, "carried": 2}})
    ledger = {"launched": 6, "consumed": 4, "retried": 0, "waste": 2, "in_flight": 0,
              "finished": 0, "delivered": 0}
    page = write_report(tmp_path / "r.html", title="t", trajectories=trajs, events=[],
                        batches=[s.to_dict()], config={"secret_dump": 1}, ledger=ledger,
                        interrupted="SIGINT").read_text()
    assert "Interrupted (SIGINT)" in page
    assert "<th>attempts</th><td>6 launched: 4 in batches (67%), 2 wasted (33%)</td>" in page
    assert "<h2>Outcomes per batch</h2>" in page and ">model_success</th>" in page
    assert "{&quot;model_failure&quot;" not in page  # no raw dict
    assert page.index("<details>") < page.index("secret_dump") < page.index("</details>")
    (hand, tail_a, tail_b), = batch_marks([s.to_dict()], 0.0)
    assert hand == 5.0 and tail_a == pytest.approx(s.t90_s) and tail_b == pytest.approx(s.t100_s)


@needs_matplotlib
def test_the_headline_names_its_populations_and_the_tables_speak_words(tmp_path: Path) -> None:
    """Regression (the report of a real run): the headline's "outcomes" counted the batch's
    16 trajectories beside a chart of all 24 finished attempts, without saying so; "12 wasted"
    did not say why while the batch table said "carried 12"; span kinds (exec, sandbox_setup)
    and JSON keys (n_groups, inference_idle_env_s) were the only labels."""
    trajs = [traj(i, 0.5 * i, 0.5 * i + 3) for i in range(6)]
    trajs[0].outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=1.0)
    trajs[5].outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=1.0)
    cap = Capacity(10, 40, 100, 400, sandbox_slots=4)
    s = summarize_batch(0, trajs[:4], t_start=0.0, t_end=5.0, seen=trajs, capacity=cap,
                        servers=["s0", "s1"])
    ledger = {"launched": 8, "consumed": 4, "waste": 4, "waste_by_reason": {"unconsumed_at_close": 4}}
    rows = dict(headline([s.to_dict()], trajs, ledger=ledger))
    assert rows["outcomes in batches"] == "4 trajectories: model_failure 3 (75%), model_success 1 (25%)"
    assert rows["outcomes of all finished attempts"] == \
        "6 attempts: model_failure 4 (67%), model_success 2 (33%)"
    assert rows["attempts"] == ("8 launched: 4 in batches (50%), 4 wasted (50%: 4 still running "
                                "or unused when the run ended)")
    went = rows["where time went"]
    assert "waiting for the model" in went and "tool commands" in went and "exec" not in went
    page = write_report(tmp_path / "r.html", title="t", trajectories=trajs, events=[],
                        batches=[s.to_dict()], ledger=ledger).read_text()
    assert "<th title='n_groups'>groups</th>" in page
    assert "<th title='inference_idle_env_s'>servers idle while episodes in sandboxes (s)</th>" in page


@needs_matplotlib
def test_the_report_is_written_again_from_an_output_folder(tmp_path: Path) -> None:
    """report_from_run_dir reads summary.json, events.jsonl and episodes/*.json back: the same
    headline as the report written at the end of the run."""
    import json

    from episode_rig import make_task

    from rollbank.episodes.replay import episode_record
    from rollbank.metrics.report import report_from_run_dir

    trajs = [traj(i, 0.5 * i, 0.5 * i + 3) for i in range(4)]
    trajs[1].outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=1.0)
    s = summarize_batch(0, trajs, t_start=0.0, t_end=5.0, seen=trajs,
                        capacity=Capacity(10, 40, 100, 400, sandbox_slots=4), servers=["s0", "s1"])
    ledger = {"launched": 4, "consumed": 4}
    run = tmp_path / "run-1"
    (run / "episodes").mkdir(parents=True)
    for t in trajs:
        (run / "episodes" / f"{t.trajectory_id.replace('/', '__')}.json").write_text(
            json.dumps(episode_record(t, make_task("x"), {})))
    (run / "events.jsonl").write_text("")
    (run / "summary.json").write_text(json.dumps({"batches": [s.to_dict()], "ledger": ledger,
                                                  "setup_s": 1.5, "collection_s": 5.0}))
    page = report_from_run_dir(run).read_text()
    expected = write_report(tmp_path / "direct.html", title="rollbank collect: run-1",
                            trajectories=trajs, events=[], batches=[s.to_dict()], setup_s=1.5,
                            ledger=ledger).read_text()
    head = page.split("<h2>")[0]
    assert head.split("</table>")[0] == expected.split("<h2>")[0].split("</table>")[0]
    assert "4 attempts: model_failure 3 (75%), model_success 1 (25%)" in head
    assert page.count("data:image/png;base64,") == 5  # glance, two timelines, CDF, bank
