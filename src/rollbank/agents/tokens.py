"""The gateway's session record -> the trajectory (pure).

Invariants
- The trajectory's tokens are the record's, exactly: ``SessionRecord.tokens`` (the attempt's
  whole sequence, segments one after the other). Model tokens keep mask 1 with the engine's
  behaviour log-prob and per-token version; every other token (prompt, template framing, tool
  results, the agent's own text) is mask 0, log-prob 0.0, version -1. A record that breaks
  this is refused (``ValueError``: rollbank's bug, recorded as ``host_error``).
- ``prompt_len`` is the first segment's first prompt (the tokens before the first model token).
- Steps interleave, in time order, one per model request (its text, server, finish reason,
  seconds) and one per command the agent ran in the sandbox (the command, exit code, output
  tail): the replay that attribution may run re-runs exactly those commands.
- Requests that failed, were aborted or cancelled contribute no tokens (the gateway records
  tokens only for answered requests); they are counted in the session facts.
- Every answered request is an ``inference`` span (``episodes/spans.py``: its server, prompt,
  cached and generated token counts, on the gateway's clock, which is the collector's), as
  the harness runner records its own generations: the batch summary's tokens/s, busy time
  and lower bound count the agent's generations too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rollbank.agents.sandbox_api import CommandRecord
from rollbank.agents.verdict import SandboxFacts, SessionFacts
from rollbank.episodes.spans import Span, add_span
from rollbank.episodes.trajectory import ENV_VERSION, StepRecord, Trajectory
from rollbank.gateway.records import RequestRecord, SessionRecord

OUTPUT_TAIL = 2000


def record_into(traj: Trajectory, record: SessionRecord) -> None:
    """Copy the session's tokens into ``traj`` (which holds none yet) and its summary into
    ``traj.meta["gateway"]``."""
    t = record.tokens
    ids, lps = list(t.get("token_ids", [])), [float(x) for x in t.get("logprobs", [])]
    mask, vers = [int(x) for x in t.get("loss_mask", [])], [int(x) for x in t.get("versions", [])]
    if not len(ids) == len(lps) == len(mask) == len(vers):
        raise ValueError(f"session {record.session_id}: {len(ids)} ids, {len(lps)} log-probs, "
                         f"{len(mask)} mask, {len(vers)} versions")
    for i, (m, lp, v) in enumerate(zip(mask, lps, vers, strict=True)):
        if m == 1 and (not math.isfinite(lp) or v < 0):
            raise ValueError(f"session {record.session_id}: model token {i} has log-prob {lp}, "
                             f"version {v}")
        if m == 0 and (lp != 0.0 or v != ENV_VERSION):
            raise ValueError(f"session {record.session_id}: environment token {i} carries "
                             f"log-prob {lp}, version {v}")
        if m not in (0, 1):
            raise ValueError(f"session {record.session_id}: loss mask {m} at token {i}")
    if traj.token_ids:
        raise ValueError(f"trajectory {traj.trajectory_id} already holds tokens")
    traj.token_ids, traj.logprobs, traj.loss_mask, traj.policy_versions = ids, lps, mask, vers
    traj.prompt_len = mask.index(1) if 1 in mask else len(ids)
    traj.meta["gateway"] = {
        "session_id": record.session_id, "model": record.model,
        "requests": len(record.requests), "rejected": record.rejected,
        "segments": list(record.segments), "edits": list(record.edits),
        "statuses": [r.status for r in record.requests],
        "output_tokens": [len(r.output_token_ids) for r in record.requests if r.status == "ok"],
    }
    traj.meta["segments"] = list(record.segments)
    for r in record.requests:  # the engine's work, as the harness runner records it
        if r.status == "ok" and r.server is not None and r.timings.total_s is not None:
            end = r.timings.received_at + r.timings.total_s
            start = min(r.timings.received_at + (r.timings.slot_wait_s or 0.0), end)
            add_span(traj, Span("inference", start, end, traj.trajectory_id, server=r.server,
                                prompt_tokens=len(r.prompt_token_ids),
                                cached_tokens=r.cached_prompt_tokens,
                                gen_tokens=len(r.output_token_ids)))


def session_facts(record: SessionRecord, *, max_model_len: int, min_new_tokens: int) -> SessionFacts:
    """The counts the verdict reads. A refused request whose prompt cannot fit the context is
    told apart by its measured length, not by its error text."""
    errs: list[str] = []
    refusals: list[int] = []
    for r in record.requests:
        if r.status in ("error", "aborted"):
            n = len(r.prompt_token_ids)
            if r.status == "error" and n + min_new_tokens > max_model_len:
                refusals.append(n)
            else:
                errs.append(f"{r.request_id}: {r.status}: {r.error or ''}"[:300])
    return SessionFacts(
        requests=len(record.requests), ok=sum(r.status == "ok" for r in record.requests),
        rejected=record.rejected, engine_errors=tuple(errs), context_refusals=tuple(refusals),
        cancelled=sum(r.status == "cancelled" for r in record.requests))


def sandbox_facts(commands: Sequence[CommandRecord], *, runtime_error: str | None,
                  node_lost: bool) -> SandboxFacts:
    results = [c.result for c in commands if c.result is not None]
    return SandboxFacts(runtime_error=runtime_error, node_lost=node_lost,
                        budget_exhausted=any(r.budget_exhausted for r in results),
                        host_stalled=any(r.host_stalled for r in results), commands=len(commands))


def steps_of(requests: Sequence[RequestRecord], commands: Sequence[CommandRecord],
             *, clock_offset: float = 0.0) -> list[StepRecord]:
    """One step per model request and per command, in time order (``clock_offset``: the
    gateway's clock minus the runner's, 0 when they share one)."""
    rows: list[tuple[float, int, Any]] = [
        (r.timings.received_at - clock_offset, 0, r) for r in requests]
    rows += [(c.started_at, 1, c) for c in commands]
    rows.sort(key=lambda x: (x[0], x[1]))
    steps: list[StepRecord] = []
    for i, (_, kind, item) in enumerate(rows):
        if kind == 0:
            r: RequestRecord = item
            steps.append(StepRecord(index=i, model_text=r.text, action=None, observation="",
                                    inference_s=r.timings.total_s or 0.0, server=r.server,
                                    finish_reason=r.finish_reason if r.status == "ok" else r.status))
            continue
        c: CommandRecord = item
        res = c.result
        obs = c.error or "" if res is None else (res.stdout + res.stderr)[-OUTPUT_TAIL:]
        steps.append(StepRecord(
            index=i, model_text="", action=c.command, observation=obs,
            exit_code=None if res is None else res.exit_code,
            signal=None if res is None else res.signal,
            timed_out=False if res is None else res.timed_out,
            exec_s=0.0 if res is None else res.billed_s))
    return steps
