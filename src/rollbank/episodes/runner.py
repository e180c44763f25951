"""The episode runner: one attempt end to end, implementing the driver's ``AttemptRunner``.

Per attempt: acquire a sandbox (fork from a warm snapshot or a cold build, via the injected
:class:`~rollbank.episodes.sources.SandboxSource`), then turn after turn: the conversation's
prompt (token ids) -> ``router.route`` -> ``client.generate`` under the driver's per-server
inference slot (tokens tagged with log-probs and the weight version) -> ``harness.parse`` ->
commands in the sandbox with the per-step timeout and the episode budget -> the observation
appended. Then the verifier, then :func:`~rollbank.episodes.attribution.attribute`.

Invariants
- ``run`` never raises for an episode failure: every boundary error becomes an
  :class:`EpisodeOutcome` (a failed episode is data). Only cancellation propagates.
- The sandbox (and its shell session) is closed on every path, cancellation included.
- Every routed request is reported back to the router exactly once (finish or abort).
- Every verifier run holds the scheduler's verifier slot (``attempt.ctx.verifier_slot()``:
  the group closest to complete first); the verifier's own timeout starts once it holds it.
- The returned trajectory matches its :class:`AttemptSpec` (id, group, task, slot, retry,
  seed, launched_at) and carries spans (``episodes/spans.py``) for the metrics.
- Its token sequence never exceeds ``max_model_len``: an observation after which no turn
  would fit ends the episode (``context_exhausted``) and stays only in the step record.
- When a recorder is set, every finished episode is written as a replayable episode file.
- With a trace workload (``episodes/workload.py``) the plan, not ``harness.parse``, decides
  each turn's action, token count and the episode's length; everything else is unchanged.
- With an agent hook (``AgentHook``: ``agents/episode.py``) an agent program replaces the
  harness loop: it drives the sandbox and the model through its gateway session; its tokens
  are the gateway's record; verification, attribution and replay (its commands) are the same.
- A multi-step task (Harbor 1.1 ``[[steps]]``) runs its steps in order in one sandbox and one
  conversation, each verified and attributed by the same path (``episodes/steps.py``).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from rollbank.clock import Clock, MonotonicClock
from rollbank.episodes.attempt import AttemptContext, AttemptSpec
from rollbank.episodes.attribution import (
    TIMED_OUT_ENDS,
    VERIFIABLE,
    Experiment,
    LoopEnd,
    Probe,
    VerifierVerdict,
    attribute,
    needs_disk_check,
    needs_experiment,
    stalled,
)
from rollbank.episodes.billing import step_bill
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.conversation import Conversation, open_conversation
from rollbank.episodes.counterfactual import Counterfactual, ReplaySpec
from rollbank.episodes.harnesses import ActionKind, Command, Harness
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.sources import SandboxSource, Verifier
from rollbank.episodes.spans import Span, add_span
from rollbank.episodes.steps import run_steps, turn_in_step
from rollbank.episodes.tools import ToolExecutor, close_quietly
from rollbank.episodes.trajectory import StepRecord, Trajectory
from rollbank.episodes.workload import EpisodePlan, TraceWorkload
from rollbank.errors import (
    BuildError,
    InferenceError,
    SandboxError,
    SandboxLostError,
)
from rollbank.inference.protocol import GenerateRequest, InferenceClient, Tokenizer
from rollbank.routing.router import Router, RouteRequest
from rollbank.sandbox.protocol import Sandbox, SandboxUsage
from rollbank.tasks.model import Task

log = logging.getLogger(__name__)

class EpisodeSink(Protocol):
    """Receives every finished episode (the replay recorder implements it)."""

    async def record(self, traj: Trajectory, task: Task, meta: Mapping[str, Any]) -> None: ...


class AgentHook(Protocol):
    """An agent program run in place of the harness loop (``agents/episode.py``): it drives
    the acquired sandbox and reports how it ended; the runner verifies and attributes."""

    name: str

    async def run(self, attempt: AttemptSpec, task: Task, traj: Trajectory, sandbox: Sandbox,
                  workdir: str | None, budget_s: float | None,
                  probe: Callable[[Sandbox], Awaitable[Probe]]) -> tuple[LoopEnd, dict[str, Any]]: ...

    def replay_steps(self, traj: Trajectory) -> tuple[tuple[Command, ...], ...]: ...


class EpisodeRunner:
    """Runs attempts; one instance serves a whole collection (it holds no per-episode state)."""

    def __init__(
        self,
        config: RunnerConfig,
        *,
        tasks: Mapping[str, Task],
        source: SandboxSource,
        verifier: Verifier,
        harness: Harness,
        tokenizer: Tokenizer,
        clients: Mapping[str, InferenceClient],
        router: Router,
        clock: Clock | None = None,
        recorder: EpisodeSink | None = None,
        workload: TraceWorkload | None = None,
        counterfactual: Counterfactual | None = None,
        agent: AgentHook | None = None,
    ) -> None:
        missing = set(router.servers) - set(clients)
        if missing:
            raise ValueError(f"router servers without a client: {sorted(missing)}")
        self.config = config
        self.tasks = tasks
        self.source = source
        self.verifier = verifier
        self.harness = harness
        self.tokenizer = tokenizer
        self.clients = clients
        self.router = router
        self.clock: Clock = clock or MonotonicClock()
        self.recorder = recorder
        self.workload = workload
        self.agent = agent
        # error paths only: probes and a pristine re-verify decide who caused a failure
        self.judge = counterfactual or Counterfactual(
            source, verifier, probe_timeout_s=config.health_probe_timeout_s, clock=self.clock,
            replay_cap_s=config.replay_cap_s)

    # ------------------------------------------------------------ AttemptRunner
    async def run(self, attempt: AttemptSpec) -> Trajectory:
        task = self.tasks[attempt.task_id]
        traj = Trajectory(
            trajectory_id=attempt.attempt_id, group_id=attempt.group_id, task_id=task.task_id,
            attempt=attempt.slot, retry=attempt.retry, seed=attempt.seed,
            launched_at=attempt.launched_at, task_hash=task.content_hash,
        )
        traj.meta.update(harness=self.agent.name if self.agent else self.harness.name,
                         source=self.source.name,
                         runner=self.config.model_dump(mode="json"))
        try:
            await self._episode(attempt, task, traj)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug on our side: unattributable, kept as data
            traj.outcome = attribute(
                LoopEnd.HOST_ERROR,
                evidence={"error": f"{type(exc).__name__}: {exc}",
                          "traceback": traceback.format_exc(limit=8)},
            )
        traj.finished_at = self.clock.now()
        if self.recorder is not None:
            try:
                await self.recorder.record(traj, task, traj.meta)
            except Exception as exc:  # the episode file is a by-product: the outcome stands
                log.warning("episode %s: recorder failed: %s: %s", traj.trajectory_id,
                            type(exc).__name__, exc)
                traj.meta.setdefault("events", []).append(
                    {"event": "recorder_error", "error": f"{type(exc).__name__}: {exc}"})
        return traj

    # ------------------------------------------------------------ phases
    async def _episode(self, attempt: AttemptSpec, task: Task, traj: Trajectory) -> None:
        cfg = self.config
        budget = cfg.episode_budget_s or task.agent_timeout_s
        t0 = self.clock.now()
        try:
            acq = await self.source.acquire(task, budget_s=None)  # the executor charges it
        except BuildError as exc:
            traj.outcome = attribute(LoopEnd.ENV_BUILD_FAILED, evidence={"error": str(exc)})
            return
        except SandboxError as exc:
            traj.outcome = attribute(LoopEnd.SANDBOX_START_FAILED,
                                     evidence={"error": f"{type(exc).__name__}: {exc}"})
            return
        sandbox = acq.sandbox
        t1 = self.clock.now()
        traj.started_at, traj.sandbox_setup_s = t1, t1 - t0
        traj.layer_hashes = list(acq.layer_hashes)
        traj.meta.update(sandbox_kind=acq.kind, sandbox_id=sandbox.sandbox_id,
                         workdir=acq.workdir, sandbox_detail=dict(acq.detail))
        add_span(traj, Span("sandbox_setup", t0, t1, traj.trajectory_id, sandbox=sandbox.sandbox_id))
        attempt.ctx.mark_started()
        executor = ToolExecutor(sandbox, step_timeout_s=cfg.step_timeout_s,
                                use_shell=cfg.use_shell, workdir=acq.workdir, budget_s=budget)
        try:
            if task.multi_step and self.agent is None:  # steps in order, each verified
                traj.outcome = await run_steps(self, attempt, task, traj, executor, sandbox,
                                               acq.workdir)
            else:
                end, evidence = await (self.loop(attempt, task, traj, executor, sandbox)
                                       if self.agent is None else self.agent.run(
                    attempt, task, traj, sandbox, acq.workdir, budget, self.judge.probe))
                if end in VERIFIABLE:
                    await executor.close()
                traj.outcome = await self.conclude(end, evidence, task, traj, attempt.ctx,
                                                    sandbox)
        finally:
            await close_quietly(executor, sandbox)
            add_span(traj, Span("episode", t0, max(self.clock.now(), t0), traj.trajectory_id,
                                sandbox=sandbox.sandbox_id))

    async def loop(
        self, attempt: AttemptSpec, task: Task, traj: Trajectory, executor: ToolExecutor,
        sandbox: Sandbox, conv: Conversation | None = None, task_step: int | None = None,
    ) -> tuple[LoopEnd, dict[str, Any]]:
        """The agent's turns; a multi-step task (``episodes/steps.py``) passes its ongoing
        conversation and the step index, and turn indices continue across steps."""
        cfg = self.config
        if conv is None:
            conv = open_conversation(self.harness, self.tokenizer, traj, task)
        first = len(traj.steps)
        sampling = self.harness.sampling()
        timeouts = 0
        plan: EpisodePlan | None = None
        if self.workload is not None:  # a trace decides turns, tokens and tool time
            plan = self.workload.plan(task.task_id, attempt.seed)
            traj.meta["workload"] = {"kind": "trace", "turns": len(plan.turns),
                                     "tokens": plan.tokens, "tool_s": round(plan.tool_s, 3)}
        for k in range(cfg.max_turns if plan is None else len(plan.turns)):
            turn = first + k
            room = cfg.max_model_len - len(conv)
            if room < cfg.min_new_tokens:
                end = LoopEnd.CONTEXT if turn else LoopEnd.PROMPT_TOO_LONG  # never acted: not its
                return end, {"turn": turn, "prompt_tokens": len(conv),
                             "max_model_len": cfg.max_model_len}
            rid = f"{traj.trajectory_id}/t{turn}"
            prompt = conv.prompt_token_ids
            server = self.router.route(RouteRequest(rid, traj.trajectory_id, traj.group_id, prompt))
            if plan is None:
                sp = replace(sampling, max_tokens=min(sampling.max_tokens, room))
            else:
                sp = plan.turns[k].sampling(sampling, room)
            request = GenerateRequest(rid, prompt, sp)
            try:
                async with attempt.ctx.inference_slot(server):
                    ts = self.clock.now()
                    result = await self.clients[server].generate(request)
            except InferenceError as exc:
                self.router.on_abort(server, rid)
                return LoopEnd.INFERENCE_ERROR, {
                    "turn": turn, "server": server, "error": f"{type(exc).__name__}: {exc}"}
            except BaseException:
                self.router.on_abort(server, rid)
                raise
            self.router.on_finish(server, rid)
            te = self.clock.now()
            add_span(traj, Span("inference", ts, te, traj.trajectory_id, server=server,
                                prompt_tokens=len(prompt), cached_tokens=result.cached_prompt_tokens,
                                gen_tokens=len(result.token_ids)))
            traj.inference_s += te - ts
            if server not in traj.servers:
                traj.servers.append(server)
            conv.append_result(result)
            action = self.harness.parse(result.text) if plan is None else plan.action(k)
            step = StepRecord(index=turn, model_text=result.text, action=action.command_text,
                              observation="", inference_s=te - ts, server=server,
                              finish_reason=result.finish_reason, task_step=task_step)
            traj.steps.append(step)
            if result.finish_reason == "abort":
                return LoopEnd.ABORTED, {"turn": turn, "server": server, "why": "server aborted"}
            if action.kind is ActionKind.MALFORMED:
                step.observation = action.observation or ""
                if not self.observe(conv, traj, step.observation):
                    return LoopEnd.CONTEXT, {"turn": turn, "prompt_tokens": len(conv)}
                continue
            if action.commands:
                tx = self.clock.now()
                try:
                    results = await executor.run(action.commands)
                except SandboxError as exc:
                    return LoopEnd.SANDBOX_DIED, {"turn": turn, "error": f"{type(exc).__name__}: {exc}",
                                                  **_lost(exc)}
                finally:
                    ty = self.clock.now()
                    add_span(traj, Span("exec", tx, ty, traj.trajectory_id, sandbox=sandbox.sandbox_id))
                    traj.tool_s += ty - tx
                last = results[-1]
                step.exit_code, step.signal, step.timed_out = last.exit_code, last.signal, last.timed_out
                bill = step_bill(results)  # step timeouts and budget count billed seconds
                step.exec_s = bill.wall_s
                step.observation = self.harness.format_observation(results)
                timeouts += sum(r.timed_out for r in results)
                ev = {"turn": turn, "step_timeouts": timeouts, "exit_code": last.exit_code,
                      "signal": last.signal, "oom_killed": last.oom_killed, **bill.evidence()}
                if bill.host_stalled:  # the host, not the model, stopped the command
                    return LoopEnd.HOST_ERROR, ev
                if any(r.budget_exhausted for r in results):
                    return LoopEnd.BUDGET, ev
                if last.timed_out and cfg.step_timeout_ends_episode:
                    return LoopEnd.STEP_TIMEOUT, ev
                if not sandbox.alive:
                    return LoopEnd.SANDBOX_DIED, ev
            if action.done:
                return LoopEnd.DONE, {"turn": turn, "step_timeouts": timeouts}
            if not self.observe(conv, traj, step.observation):
                return LoopEnd.CONTEXT, {"turn": turn, "prompt_tokens": len(conv),
                                         "step_timeouts": timeouts}
        return LoopEnd.MAX_TURNS, {"turn": cfg.max_turns, "step_timeouts": timeouts}

    def observe(self, conv: Conversation, traj: Trajectory, text: str) -> bool:
        """Append an observation; False (and nothing appended) if no next turn would fit."""
        n = len(traj.token_ids)
        conv.append_observation(text)
        if len(conv) + self.config.min_new_tokens <= self.config.max_model_len:  # the next prompt
            return True
        for seq in (traj.token_ids, traj.logprobs, traj.loss_mask, traj.policy_versions):
            del seq[n:]
        traj.segment_starts = [s for s in traj.segment_starts if s < n]
        return False

    async def conclude(self, end: LoopEnd, evidence: dict[str, Any], task: Task,
                        traj: Trajectory, ctx: AttemptContext, sandbox: Sandbox) -> EpisodeOutcome:
        """Verify, and on an error path run the counterfactual experiment (which may replay
        the model's actions on a fresh pristine fork, ``counterfactual.ReplaySpec``)."""
        verdict: VerifierVerdict | None = None
        exp: Experiment | None = None
        if end in TIMED_OUT_ENDS:  # does the sandbox still answer after a step timed out?
            exp = await self.judge.after_step_timeout(sandbox, task, self._replay_spec(task, traj))
        if end in VERIFIABLE and not stalled(exp):
            verdict, died = await self._verify(sandbox, task, traj, ctx)
            if died is not None:
                end, evidence = LoopEnd.SANDBOX_DIED, {**evidence, "verifier_error": died}
                if died.startswith(SandboxLostError.__name__):
                    evidence["node_lost"] = True
        # a lost node (its host died) is certain infra: no experiment needed (attribute())
        if needs_experiment(end, verdict) and not evidence.get("node_lost"):
            # the failure surfaced during verification: the replayed fork is verified too
            spec = replace(self._replay_spec(task, traj), then_verify=verdict is not None)
            async with ctx.verifier_slot():  # a re-verify is verifier work
                exp = await self.judge.after_error(end, verdict, sandbox, task, spec)
        elif needs_disk_check(end, verdict) and not evidence.get("node_lost"):
            # a verified failure: a full writable layer is the host's or the model's?
            disk = await self.judge.after_fail(sandbox, task, self._replay_spec(task, traj))
            if disk is not None:
                exp = replace(disk, episode=exp.episode) if exp is not None else disk
        return attribute(end, verdict=verdict, usage=_usage(sandbox),
                         actions=[s.action for s in traj.steps], evidence=evidence, experiment=exp)

    def _replay_spec(self, task: Task, traj: Trajectory) -> ReplaySpec:
        """The model's actions (each turn's text parsed again, or the plan's) and limits."""
        plan = self.workload.plan(task.task_id, traj.seed) if self.workload is not None else None
        steps = tuple(  # a trace plan restarts at each step of a multi-step task
            (self.harness.parse(s.model_text) if plan is None else plan.action(k)).commands
            for s, k in zip(traj.steps, turn_in_step(traj.steps), strict=True)
        ) if self.agent is None else self.agent.replay_steps(traj)  # an agent's commands
        workdir = traj.meta.get("workdir")
        return ReplaySpec(steps, step_timeout_s=self.config.step_timeout_s,
                          use_shell=self.config.use_shell and self.agent is None,
                          workdir=workdir if isinstance(workdir, str) else None,
                          budget_s=self.config.episode_budget_s or task.agent_timeout_s)

    async def _verify(
        self, sandbox: Sandbox, task: Task, traj: Trajectory, ctx: AttemptContext
    ) -> tuple[VerifierVerdict, str | None]:
        """The verdict, and an error text if the sandbox runtime died during verification."""
        # waiting here is sandbox time, not verifier time; the scheduler's verifier slots
        async with ctx.verifier_slot():
            return await self._verify_now(sandbox, task, traj)

    async def _verify_now(
        self, sandbox: Sandbox, task: Task, traj: Trajectory
    ) -> tuple[VerifierVerdict, str | None]:
        t0 = self.clock.now()
        died: str | None = None
        try:
            verdict = await self.verifier.verify(sandbox, task)
        except SandboxError as exc:
            verdict = VerifierVerdict(None, error=Reason.VERIFIER_CRASH, detail=str(exc))
            died = f"{type(exc).__name__}: {exc}"
        t1 = self.clock.now()
        traj.verify_s = t1 - t0
        add_span(traj, Span("verify", t0, t1, traj.trajectory_id, sandbox=sandbox.sandbox_id))
        return replace(verdict, duration_s=t1 - t0), died


def _lost(exc: SandboxError) -> dict[str, Any]:
    """Evidence that the node hosting the sandbox was lost (a cluster backend)."""
    return {"node_lost": True} if isinstance(exc, SandboxLostError) else {}


def _usage(sandbox: Sandbox) -> SandboxUsage | None:
    try:
        return sandbox.usage()
    except Exception:
        return None
