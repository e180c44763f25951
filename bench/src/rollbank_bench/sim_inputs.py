"""What the simulator needs from a measured ``rollbank bench collect`` arm (pure reading, no I/O
beyond the arm's own output directory).

A collect arm writes its resolved config, its event log and one episode file per finished
attempt. :func:`arm_inputs` turns them into the simulator's model inputs for that arm:

- the scheduler section as the run resolved it, the verifier slots the driver used, the task
  sequence the collector handed the scheduler and the trace workload config (so the simulator
  replays the same plans: a plan depends only on (workload, task id, attempt seed)), and each
  task's episode budget (tool seconds; the runner ends an episode that spends it);
- :class:`ArmCosts`, the per-attempt costs the plan does not say, each the median over the
  arm's finished attempts except the verifier run, the mean (a contended verifier is a queue
  whose throughput the mean sets; on the loaded run of 2026-11-30 the median put the
  optimized arm at -10.8% instead of +1.3%): sandbox set-up (a fresh start from cached layers, or a fork), the
  round trip a command adds to its planned ``sleep``, what a generate call takes beyond the
  engine profile's prefill + decode (HTTP, tokenisation), the verifier run, and the rest of an
  episode outside the verifier slot (closing the shell before the verifier — the part of that
  gap when a verifier slot was free, the rest being the slot wait the simulator models itself,
  reconstructed from every attempt's verifier span — then tearing the sandbox down and the
  episode record), plus prompt and observation sizes for the prefix-cache model;
- each verified attempt's own verifier run (``verify_s_by_attempt``, by its plan's task id and
  seed), which the simulator replays as it replays plans, the mean standing for attempts the
  run did not measure: verifiers share the host's cores and run slowest when many episodes
  end together, so a mean service time shrinks the queue (fed the measured arrivals, a
  two-slot FIFO queue waits 196 s with the mean and 1542 s with each attempt's own time,
  measured 1565 s; the naive arm of the 2026-12-04 tb2 replicate);
- a plan check: how many finished attempts ran exactly the planned sleeps.

:func:`sim_profile` maps an accelsim latency profile (``rollbank_bench.accelsim``) onto the
simulator's :class:`~rollbank.scheduling.sim.sim_model.LatencyProfile` at a given context length.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollbank.episodes.workload import TraceWorkload, WorkloadConfig
from rollbank.scheduling.sim.sim_model import LatencyProfile
from rollbank_bench.traces import TOKENS_PER_CHAR


@dataclass(frozen=True)
class ArmCosts:
    """Per-attempt costs of one measured arm (seconds; medians over its finished attempts,
    the verifier run's mean)."""

    setup_s: float = 0.5  # sandbox acquired: fresh start from cached layers, or a fork
    turn_overhead_s: float = 0.05  # a command's round trip beyond its planned sleep
    call_s: float = 0.0  # a generate call beyond the profile's prefill + decode
    verify_s: float = 0.3  # the verifier run (inside a verifier slot)
    close_s: float = 1.0  # outside the verifier and its slot wait: close, teardown, record
    prompt_tokens: int = 512  # the task prompt (turn 0, shared by the group)
    obs_tokens: int = 24  # new tokens per later turn (observation + template)
    # new tokens per character the previous turn's command printed (agent-shaped traces;
    # obs_tokens is then the rest: template and command line)
    obs_tokens_per_char: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {k: round(float(v), 4) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArmCosts:
        known = set(cls.__dataclass_fields__)
        raw = {k: v for k, v in d.items() if k in known}
        for k in ("prompt_tokens", "obs_tokens"):  # obs_tokens_per_char stays a float
            if k in raw:
                raw[k] = round(float(raw[k]))
        return cls(**raw)


def sim_profile_long(accel: Any, *, call_s: float = 0.0) -> LatencyProfile:
    """An accelsim profile (with its instrument scales) as the simulator's long-context
    profile: decode per step ``k (base + per_seq b) / c`` plus ``k^2 per_ctx / c`` per wire
    context token in service, the engine's KV capacity in wire tokens (its admission cap),
    prefill ``k x per_token / c`` per uncached wire token."""
    k = float(getattr(accel, "token_scale", 1.0))
    c = float(getattr(accel, "time_scale", 1.0))
    per_seq = k * float(accel.decode_per_seq_s) / c
    single = k * float(accel.step_base_s) / c + per_seq
    return LatencyProfile(
        name=str(accel.name), prefill_s_per_token=k * float(accel.prefill_per_token_s) / c,
        decode_s_per_token=single, decode_batch_slope=per_seq / single if single else 0.0,
        call_s=call_s, decode_s_per_ctx_token=k * k * float(accel.decode_per_ctx_token_s) / c,
        kv_tokens=int(accel.kv_capacity_blocks * accel.block_size))


def sim_profile(accel: Any, *, context_tokens: int, call_s: float = 0.0) -> LatencyProfile:
    """An accelsim profile's step model as the simulator's per-call profile: one decode token
    costs ``step_base + per_seq + context x per_ctx_token`` alone, each more sequence in the
    batch adds ``per_seq + context x per_ctx_token``; prefill per uncached token. With the
    instrument's scales (``token_scale`` k, ``time_scale`` c; 1 unless set) a wire token costs
    k modelled steps at k x the context, compressed by c, as the engine charges it."""
    k = float(getattr(accel, "token_scale", 1.0))
    c = float(getattr(accel, "time_scale", 1.0))
    per_seq = k * (float(accel.decode_per_seq_s)
                   + k * context_tokens * float(accel.decode_per_ctx_token_s)) / c
    single = k * float(accel.step_base_s) / c + per_seq
    if k == 1.0 and c == 1.0:  # exactly the unscaled arithmetic
        per_seq = float(accel.decode_per_seq_s) + context_tokens * float(accel.decode_per_ctx_token_s)
        single = float(accel.step_base_s) + per_seq
    return LatencyProfile(
        name=str(accel.name), prefill_s_per_token=k * float(accel.prefill_per_token_s) / c,
        decode_s_per_token=single, decode_batch_slope=per_seq / single if single else 0.0,
        call_s=call_s)


def _median(xs: Iterable[float], default: float) -> float:
    vals = list(xs)
    return statistics.median(vals) if vals else default


def free_time(start: float, end: float, busy: Sequence[tuple[float, float]],
              slots: int) -> float:
    """Seconds of ``[start, end]`` during which fewer than ``slots`` of the ``busy``
    intervals (verifier runs) were active: time an attempt waiting there was not waiting
    for a verifier slot."""
    if end <= start:
        return 0.0
    cuts = sorted({start, end, *(x for iv in busy for x in iv if start < x < end)})
    free = 0.0
    for a, b in itertools.pairwise(cuts):
        mid = (a + b) / 2
        if sum(1 for s, e in busy if s <= mid < e) < slots:
            free += b - a
    return free


def around_verifier(spans: Sequence[dict[str, Any]],
                     finished_at: float) -> tuple[float, float, float] | None:
    """(end of the last sandbox/inference span, the verifier's start, time after the
    verifier to the end of the attempt), from an episode's spans; None without a verify span.
    The gap is closing the shell plus the wait for a verifier slot, which the simulator
    models itself (:func:`free_time` separates them)."""
    ver = [x for x in spans if x.get("kind") == "verify"]
    work = [float(x["end"]) for x in spans
            if x.get("kind") in ("sandbox_setup", "inference", "exec")]
    if not ver or not work:
        return None
    start, end = float(ver[0]["start"]), float(ver[-1]["end"])
    return max(work), start, max(0.0, finished_at - end)


def _mean(xs: Iterable[float], default: float) -> float:
    vals = list(xs)
    return statistics.fmean(vals) if vals else default


def _episodes(out_dir: Path) -> list[dict[str, Any]]:
    folder = out_dir / "episodes"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] \
        if folder.is_dir() else []


def _planned_sleep(action: str) -> float | None:
    """The planned sleep of a scripted command (``sleep X``, or ``sleep X; ...`` when the
    plan also prints tool output)."""
    parts = action.split(";", 1)[0].split()
    if len(parts) == 2 and parts[0] == "sleep":
        try:
            return float(parts[1])
        except ValueError:
            return None
    return None


def lone_call_overhead(records: Sequence[dict[str, Any]],
                       profile: LatencyProfile) -> tuple[float | None, int]:
    """(median seconds a generate call took beyond the long-context ``profile``'s engine time,
    over the calls that had their server to themselves; how many such calls there were).

    A call alone on its server costs the engine its uncached prefill plus ``n`` decode steps
    at batch 1, the context growing from its prompt by one token a step:
    ``n (decode_s(1) + per_ctx L) + per_ctx n^2 / 2``. Only lone calls are compared: on a
    busy server the rest of a call's time is the batching and KV read the simulator charges
    itself (:mod:`rollbank.scheduling.sim.fluid`), so a median over every call counts it
    twice. None when no call ran alone."""
    by_server: dict[str, list[tuple[float, float, int, int, int]]] = {}
    for r in records:
        for x in r.get("spans") or []:
            if x.get("kind") == "inference" and x.get("server"):
                by_server.setdefault(str(x["server"]), []).append((
                    float(x["start"]), float(x["end"]), int(x.get("prompt_tokens") or 0),
                    int(x.get("cached_tokens") or 0), int(x.get("gen_tokens") or 0)))
    d1, per_ctx = profile.decode_s(1), profile.decode_s_per_ctx_token
    excess: list[float] = []
    for calls in by_server.values():
        calls.sort()
        busy_until = float("-inf")  # the latest end among the calls that started before
        for i, (start, end, prompt, cached, gen) in enumerate(calls):
            nxt = calls[i + 1][0] if i + 1 < len(calls) else float("inf")
            if busy_until <= start and nxt >= end:
                engine = ((prompt - cached) * profile.prefill_s_per_token
                          + gen * (d1 + per_ctx * prompt) + per_ctx * gen * gen / 2.0)
                excess.append(end - start - engine)
            busy_until = max(busy_until, end)
    return (statistics.median(excess) if excess else None), len(excess)


def costs_from_episodes(records: Sequence[dict[str, Any]], workload: TraceWorkload,
                        profile: LatencyProfile,
                        verifier_slots: int = 2) -> tuple[ArmCosts, dict[str, int]]:
    """:class:`ArmCosts` from episode records (``rollbank.episode/1``) and the plan check
    (finished attempts, how many ran their plan's sleeps exactly). ``profile`` has
    ``call_s = 0``: the call overhead is what the measured calls took beyond it; with the
    long-context model (a ``decode_s_per_ctx_token`` profile) only the calls that ran alone
    on their server count (:func:`lone_call_overhead`)."""
    setup, verify, close, overhead, call, prompt, obs = [], [], [], [], [], [], []
    per_char = TOKENS_PER_CHAR if workload.config.observation_chars_median > 0 else 0.0
    busy = [(float(x["start"]), float(x["end"])) for r in records
            for x in r.get("spans") or [] if x.get("kind") == "verify"]
    matched = 0
    for r in records:
        t, steps = r.get("timings", {}), r.get("steps", [])
        if not steps or "finished_at" not in t:
            continue
        plan = workload.plan(str(r["task_id"]), int(r["seed"]))
        sleeps = [_planned_sleep(str(s.get("action", ""))) for s in steps]
        if len(plan.turns) == len(steps) and all(
                s is not None and abs(s - p.tool_s) < 1e-6 for s, p in zip(sleeps, plan.turns,
                                                                            strict=True)):
            matched += 1
        setup.append(float(t.get("sandbox_setup_s", 0.0)))
        verify.append(float(t.get("verify_s", 0.0)))
        split = around_verifier(r.get("spans") or [], float(t["finished_at"]))
        if split is not None:
            close.append(free_time(split[0], split[1], busy, verifier_slots) + split[2])
        else:  # no spans: everything the timings leave out (a verifier wait included)
            dur = float(t["finished_at"]) - float(t["launched_at"])
            close.append(dur - sum(float(t.get(k, 0.0)) for k in
                                   ("sandbox_setup_s", "inference_s", "tool_s", "verify_s")))
        if all(sl is not None for sl in sleeps):  # the tool span beyond the planned sleeps
            overhead.append((float(t.get("tool_s", 0.0)) - sum(sl or 0.0 for sl in sleeps))
                            / len(steps))
        for s, p in zip(steps, plan.turns, strict=False):  # decode alone; prefill is ~free
            call.append(float(s.get("inference_s", 0.0)) - p.tokens * profile.decode_s(1))
        tok = r.get("tokens", {})
        if tok.get("prompt_len"):
            prompt.append(float(tok["prompt_len"]))
            ids = tok.get("token_ids") or []
            gen = sum(p.tokens for p in plan.turns)
            # the observations in the ids are those of every turn but the last (DONE)
            printed = per_char * sum(p.obs_chars for p in plan.turns[:len(steps) - 1])
            if len(steps) > 1 and len(ids) > int(tok["prompt_len"]) + gen + printed:
                obs.append((len(ids) - int(tok["prompt_len"]) - gen - printed)
                           / (len(steps) - 1))
    d = ArmCosts()
    check = {"finished": len(setup), "ran_planned_sleeps": matched}
    call_s = _median(call, 0.0)
    if profile.decode_s_per_ctx_token > 0:
        lone, check["lone_calls"] = lone_call_overhead(records, profile)
        call_s = lone or 0.0
    costs = ArmCosts(
        setup_s=_median(setup, d.setup_s), turn_overhead_s=max(0.0, _median(overhead, 0.0)),
        call_s=max(0.0, call_s), verify_s=_mean(verify, d.verify_s),
        close_s=max(0.0, _median(close, d.close_s)),
        prompt_tokens=round(_median(prompt, d.prompt_tokens)),
        obs_tokens=round(_median(obs, d.obs_tokens)), obs_tokens_per_char=per_char)
    return costs, check


def attempt_key(task_id: str, seed: int) -> str:
    """An attempt's key in ``verify_s_by_attempt``: its plan's (task id, seed)."""
    return f"{task_id}/{seed}"


def verify_times(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each verified attempt's measured verifier run (``timings.verify_s``) by
    :func:`attempt_key`. The simulator replays them per attempt, as it replays plans: the
    verifiers share the host's cores, so verdicts run slower exactly when many episodes end
    together, and a mean service time misses the queue that builds then."""
    return {attempt_key(str(r["task_id"]), int(r["seed"])): round(float(v), 4)
            for r in records if (v := (r.get("timings") or {}).get("verify_s"))}


def arm_inputs(out_dir: Path, *, task_ids: Sequence[str] | None = None,
               verifier_slots: int | None = None, accel_profile: Any = None,
               budgets: dict[str, float] | None = None) -> dict[str, Any]:
    """The simulator's inputs for one measured arm (see the module docstring). ``task_ids``:
    the collector's task sequence (default: re-selected from the resolved config, with each
    task's episode budget, ``agent_timeout_s``, in ``budgets`` unless the run set one);
    ``verifier_slots``: what the driver used (default: the resolved config's, else 2)."""
    cfg = json.loads((out_dir / "config.resolved.json").read_text())
    wcfg = WorkloadConfig.model_validate(cfg["workload"])
    if task_ids is None:
        from rollbank.collect_config import CollectConfig
        from rollbank.task_selection import select_tasks, task_sequence

        cc = CollectConfig.model_validate(cfg)
        tasks = select_tasks(cc)
        task_ids = task_sequence(tasks, cc.task_order_seed)
        if budgets is None and cfg["runner"].get("episode_budget_s") is None:
            budgets = {t.task_id: t.agent_timeout_s for t in tasks}
    sched = dict(cfg["scheduler"])
    slots = sched.get("verifier_slots") or verifier_slots or cfg["runner"].get("verifier_slots") or 2
    records = _episodes(out_dir)
    prompt = _median((float(r.get("tokens", {}).get("prompt_len") or 0) for r in records), 512.0)
    if accel_profile is None:
        base = LatencyProfile()
    elif float(getattr(accel_profile, "token_scale", 1.0)) != 1.0:  # the long-context model
        base = sim_profile_long(accel_profile)
    else:
        base = sim_profile(accel_profile, context_tokens=round(prompt))
    costs, check = costs_from_episodes(records, TraceWorkload(wcfg), base, int(slots))
    runner = cfg.get("runner") or {}
    return {"scheduler": {**sched, "verifier_slots": int(slots)},
            "context": {"max_model_len": int(runner.get("max_model_len", 2048)),
                        "min_new_tokens": int(runner.get("min_new_tokens", 16))},
            "workload": wcfg.model_dump(mode="json"), "task_ids": list(task_ids),
            "budgets": dict(budgets or {}),
            "costs": costs.to_dict(), "plan_check": check,
            "verify_s_by_attempt": verify_times(records)}


def collect_arm_inputs(cfg: Any, tasks: Sequence[Any], *, accel_profile: str | None = None,
                       accel_scales: dict[str, float] | None = None) -> dict[str, Any]:
    """:func:`arm_inputs` of a ``bench collect`` arm just run with config ``cfg`` on
    ``tasks`` (``accel_profile``: the accelsim profile name, if any, with the run's instrument
    ``accel_scales``); a failure is reported in the dict, never raised (the arm's numbers
    stand without it)."""
    from rollbank.task_selection import task_sequence

    try:
        accel = None
        if accel_profile:
            from rollbank_bench.accelsim.profile import load_profile, with_overrides

            sc = accel_scales or {}
            accel = with_overrides(load_profile(accel_profile), token_scale=sc.get("token_scale"),
                                   time_scale=sc.get("time_scale"))
        budgets = {t.task_id: t.agent_timeout_s for t in tasks} \
            if cfg.runner.episode_budget_s is None else {}
        return arm_inputs(Path(cfg.output), task_ids=task_sequence(tasks, cfg.task_order_seed),
                          verifier_slots=cfg.runner.verifier_slots or os.cpu_count(),
                          accel_profile=accel, budgets=budgets)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
