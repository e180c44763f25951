"""The gateway's answered requests become the trajectory's inference spans (what the batch
summary's tokens/s, busy time and lower bound read), as the harness runner's generations do."""

from __future__ import annotations

from typing import Any

from rollbank.agents.tokens import record_into
from rollbank.episodes.spans import spans_of
from rollbank.episodes.trajectory import Trajectory
from rollbank.gateway.records import RequestRecord, RequestTimings, SessionRecord, Status


def _request(rid: str, status: Status, received: float, total: float | None, out: list[int],
             *, slot_wait: float = 0.0, cached: int | None = None) -> RequestRecord:
    r = RequestRecord(rid, "chat", "m", False, {}, RequestTimings(received, total_s=total,
                                                                  slot_wait_s=slot_wait),
                      status=status, prompt_token_ids=[1, 2, 3], output_token_ids=out,
                      server="http://s0" if total is not None else None)
    r.cached_prompt_tokens = cached
    return r


def test_each_answered_request_is_an_inference_span_with_its_generated_tokens() -> None:
    requests = [_request("a", "ok", 10.0, 0.5, [7, 8], slot_wait=0.1, cached=2),
                _request("b", "error", 11.0, None, []),
                _request("c", "ok", 12.0, 0.25, [9, 9, 9])]
    tokens: dict[str, list[Any]] = {"token_ids": [1, 2, 3, 7, 8], "logprobs": [0.0, 0.0, 0.0, -0.5, -0.1],
              "loss_mask": [0, 0, 0, 1, 1], "versions": [-1, -1, -1, 0, 0]}
    record = SessionRecord("s", "att", "g", "m", 9.0, 13.0, requests, [], tokens, [], [])
    traj = Trajectory(trajectory_id="t", group_id="g", task_id="task", attempt=0)
    record_into(traj, record)
    spans = spans_of(traj, "inference")
    assert [(s.start, s.end, s.gen_tokens, s.prompt_tokens, s.cached_tokens, s.server)
            for s in spans] == [(10.1, 10.5, 2, 3, 2, "http://s0"), (12.0, 12.25, 3, 3, None, "http://s0")]
    assert all(s.trajectory_id == "t" for s in spans)
