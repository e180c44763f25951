"""The HTML report: self-contained, with the four plots and the batch tables."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.spans import Span, add_span
from rollbank.episodes.trajectory import Trajectory
from rollbank.extras import MissingExtraError
from rollbank.metrics.bound import Capacity
from rollbank.metrics.report import _lanes, write_report
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
    assert imgs == 4
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
    assert path.read_text().count("data:image/png;base64,") == 1


@pytest.mark.skipif(HAVE_MATPLOTLIB, reason="checks the error when rollbank[report] is missing")
def test_report_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'rollbank\[report\]'"):
        write_report(tmp_path / "r.html", title="t", trajectories=[traj(0, 0.0, 3.0)],
                     events=[], batches=[], config={})
