"""Fault kinds, the outcome each must produce, and the seeded schedule (pure: no I/O).

Every attempt of the campaign is keyed by its attempt seed (``scheduler.attempt_seed``: the
same for a slot's retries). :class:`FaultSchedule` decides, from the campaign seed and the
attempt seed alone, whether the attempt gets a fault, which one, and when (which turn, how
long into the command). The same decision is read by the scripted policy (model-caused
faults, :mod:`.script`), the sandbox injector (:mod:`.inject`) and the fault proxy
(:mod:`.proxy`), so a fault and its expected outcome are known before anything runs.

Expected outcomes follow docs/collect.md's decision table: the host's doing (a killed,
frozen or stopped sandbox, a full writable layer, a broken verifier, an engine that fails
or dies) is ``infra_failure``; the model's own doing (a command past the step timeout,
``rm -rf /``, a memory or process blow-up) is ``model_failure``; a slow engine is no
failure at all (the verifier decides: a trainable outcome); under a host-filled layer the
pinned verifier still runs, so a pass there is the model's and only a failure must be infra.

Agent kinds (``Via.AGENT``, docs/agents.md's "Who is to blame") are decided per attempt by a
schedule of their own in the campaign's agent rounds and carried out by the scripted agent
program (:mod:`.agents`) or, on the gateway's engine requests, by the fault proxy
(:mod:`.agent_proxy`): a program that crashes, never calls the model or only sends malformed
requests, a first prompt over the context and a failed engine request are infra; the
program's time running out and a context its own history filled are the model's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class Via(StrEnum):
    """Where a fault is injected from."""

    MODEL = "model"  # the scripted policy's action (the model's doing)
    SANDBOX = "sandbox"  # from outside the sandbox: signals, cgroup freeze, its layer filled
    VERIFIER = "verifier"  # the task's verifier is broken (a task of the campaign)
    ENGINE = "engine"  # the fault proxy between client and engine, or the engine process
    COLLECTOR = "collector"  # the collector process itself
    AGENT = "agent"  # an agent program behind the gateway (harness = agent): its own doing,
    # or the gateway's engine side (the fault proxy on the gateway's requests)


class FaultKind(StrEnum):
    SANDBOX_SIGKILL = "sandbox_sigkill"
    SANDBOX_FREEZE = "sandbox_freeze"
    SANDBOX_SIGSTOP = "sandbox_sigstop"
    DISK_FULL = "disk_full"
    MODEL_OOM = "model_oom"
    MODEL_PIDS = "model_pids"
    MODEL_TIMEOUT = "model_timeout"
    MODEL_DESTROY = "model_destroy"
    VERIFIER_CRASH = "verifier_crash"
    VERIFIER_HANG = "verifier_hang"
    VERIFIER_NO_REWARD = "verifier_no_reward"
    ENGINE_KILLED = "engine_killed"
    HTTP_5XX = "http_5xx"
    CONN_RESET = "conn_reset"
    SLOW_RESPONSE = "slow_response"
    TARGET_DOWN = "target_down"
    COLLECTOR_SIGKILL = "collector_sigkill"
    # agent programs behind the gateway (rollbank_bench.faults.agents)
    AGENT_KILLED = "agent_killed"
    AGENT_RAISED = "agent_raised"
    AGENT_NO_MODEL_CALL = "agent_no_model_call"
    AGENT_MALFORMED_REQUEST = "agent_malformed_request"
    AGENT_HANG = "agent_hang"
    AGENT_PROMPT_OVER_CONTEXT = "agent_prompt_over_context"
    AGENT_CONTEXT_EXHAUSTED = "agent_context_exhausted"
    GATEWAY_ENGINE_RESET = "gateway_engine_reset"
    GATEWAY_STREAM_CUT = "gateway_stream_cut"
    GATEWAY_ENGINE_MALFORMED = "gateway_engine_malformed"


INFRA = frozenset({"infra_failure"})
MODEL = frozenset({"model_failure"})
TRAINABLE = frozenset({"model_success", "model_failure"})


@dataclass(frozen=True)
class Expectation:
    via: Via
    outcomes: frozenset[str]  # the outcome(s) the decision table says the fault must produce
    why: str


EXPECT: dict[FaultKind, Expectation] = {
    FaultKind.SANDBOX_SIGKILL: Expectation(Via.SANDBOX, INFRA, "host SIGKILLs the anchor: sandbox_died"),
    FaultKind.SANDBOX_FREEZE: Expectation(Via.SANDBOX, INFRA, "host freezes the cgroup: host_stalled"),
    FaultKind.SANDBOX_SIGSTOP: Expectation(Via.SANDBOX, INFRA, "host SIGSTOPs every process of the sandbox"),
    # a failure under the host-filled layer is infra (the disk experiment: the model's replayed
    # actions leave a pristine fork room); the pinned verifier still runs, so a pass verified
    # on the model's state is the model's own
    FaultKind.DISK_FULL: Expectation(Via.SANDBOX, INFRA | {"model_success"},
                                     "host fills the writable layer (tmpfs): a failure is "
                                     "infra disk_full, a pass stands"),
    # the model's own doing, never infra; the episode goes on, so the verifier decides
    FaultKind.MODEL_OOM: Expectation(Via.MODEL, TRAINABLE, "the model's command blows the memory limit"),
    FaultKind.MODEL_PIDS: Expectation(Via.MODEL, TRAINABLE, "the model's command exhausts pids.max"),
    FaultKind.MODEL_TIMEOUT: Expectation(Via.MODEL, MODEL, "the model's command sleeps past the step timeout"),
    FaultKind.MODEL_DESTROY: Expectation(Via.MODEL, MODEL, "the model runs rm -rf /"),
    FaultKind.VERIFIER_CRASH: Expectation(Via.VERIFIER, INFRA, "tests exit non-zero, no reward (everywhere)"),
    FaultKind.VERIFIER_HANG: Expectation(Via.VERIFIER, INFRA, "tests hang past the verifier timeout"),
    FaultKind.VERIFIER_NO_REWARD: Expectation(Via.VERIFIER, INFRA, "tests exit 0 without a reward"),
    FaultKind.ENGINE_KILLED: Expectation(Via.ENGINE, INFRA, "engine process SIGKILLed mid-request"),
    FaultKind.HTTP_5XX: Expectation(Via.ENGINE, INFRA, "proxy answers 503"),
    FaultKind.CONN_RESET: Expectation(Via.ENGINE, INFRA, "proxy resets the connection (RST)"),
    FaultKind.SLOW_RESPONSE: Expectation(Via.ENGINE, TRAINABLE, "proxy delays the response: no failure"),
    FaultKind.TARGET_DOWN: Expectation(Via.ENGINE, INFRA, "the routed server's port goes down"),
    FaultKind.COLLECTOR_SIGKILL: Expectation(Via.COLLECTOR, INFRA,
                                             "collector SIGKILLed; in-flight attempts -> infra, resume"),
    # docs/agents.md, "Who is to blame": an agent program that crashes, never asks the model
    # or only sends malformed requests is infra (the program's fault, not the policy's); its
    # time running out and a context it filled itself are the model's
    FaultKind.AGENT_KILLED: Expectation(Via.AGENT, INFRA, "the agent's process is SIGKILLed "
                                        "after a model answer (gateway and sandbox healthy): agent_error"),
    FaultKind.AGENT_RAISED: Expectation(Via.AGENT, INFRA, "the agent program raises after a "
                                        "model answer and a command: agent_error"),
    FaultKind.AGENT_NO_MODEL_CALL: Expectation(Via.AGENT, INFRA, "the agent runs a command and "
                                               "returns without calling the model"),
    FaultKind.AGENT_MALFORMED_REQUEST: Expectation(Via.AGENT, INFRA, "the agent sends only "
                                                   "malformed requests (400s), then returns"),
    FaultKind.AGENT_HANG: Expectation(Via.AGENT, MODEL, "the agent hangs past agent.timeout_s "
                                      "after a model answer: the model's timeout, budget_exhausted"),
    FaultKind.AGENT_PROMPT_OVER_CONTEXT: Expectation(Via.AGENT, INFRA, "the agent's first "
                                                     "prompt is over the engine's context: "
                                                     "prompt_exceeds_context"),
    FaultKind.AGENT_CONTEXT_EXHAUSTED: Expectation(Via.AGENT, MODEL, "after a model answer the "
                                                   "history outgrows the context: context_exhausted"),
    FaultKind.GATEWAY_ENGINE_RESET: Expectation(Via.AGENT, INFRA, "the gateway's engine "
                                                "connection is reset mid-request; the agent gives up"),
    FaultKind.GATEWAY_STREAM_CUT: Expectation(Via.AGENT, INFRA, "a streamed request's engine "
                                              "connection is cut after part of the answer"),
    FaultKind.GATEWAY_ENGINE_MALFORMED: Expectation(Via.AGENT, INFRA, "the engine answers the "
                                                    "gateway 200 with a malformed body"),
}

#: Misattributions this campaign found and that are not fixed (docs/collect.md says why):
#: (kind, outcome/reason) -> the limitation. Reported apart in the JSON, still counted wrong.
KNOWN_LIMITS: dict[tuple[FaultKind, str], str] = {}
# (issue #13) CPU-heavy model commands stopped as host_stalled on a loaded host were listed
# here; billing now tells a command the host only slowed (it still gets CPU) from one it
# stopped (sandbox/billing.py), so that misattribution counts as new if it comes back.

SANDBOX_KINDS = tuple(k for k, e in EXPECT.items() if e.via is Via.SANDBOX)
MODEL_KINDS = tuple(k for k, e in EXPECT.items() if e.via is Via.MODEL)
VERIFIER_KINDS = tuple(k for k, e in EXPECT.items() if e.via is Via.VERIFIER)
ENGINE_KINDS = tuple(k for k, e in EXPECT.items() if e.via is Via.ENGINE)
#: agent kinds: injected in agent rounds (harness = agent) by their own schedule
AGENT_KINDS = tuple(k for k, e in EXPECT.items() if e.via is Via.AGENT)
#: the agent kinds the fault proxy injects on the gateway's engine requests
GATEWAY_KINDS = (FaultKind.GATEWAY_ENGINE_RESET, FaultKind.GATEWAY_STREAM_CUT,
                 FaultKind.GATEWAY_ENGINE_MALFORMED)
#: kinds decided per attempt by the schedule (verifier faults are tasks; collector kills a phase)
PER_ATTEMPT = SANDBOX_KINDS + MODEL_KINDS + ENGINE_KINDS


def selected(kinds: tuple[FaultKind, ...] | None) -> tuple[FaultKind, ...]:
    """The kinds a campaign injects (``--kinds``; None: every kind), in :data:`EXPECT` order."""
    return tuple(k for k in EXPECT if kinds is None or k in kinds)


@dataclass(frozen=True)
class Planned:
    """One attempt's fault: the kind, the turn it happens at, seconds into that turn's command
    (sandbox faults) or into the request (engine kill)."""

    kind: FaultKind
    turn: int
    delay_s: float


class FaultSchedule:
    """Which attempts get which fault, from ``(seed, attempt seed)`` only."""

    def __init__(self, seed: int, rate: float, kinds: tuple[FaultKind, ...] = PER_ATTEMPT,
                 turns: int = 2) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate {rate} not in [0, 1]")
        self.seed, self.rate, self.kinds, self.turns = seed, rate, kinds, turns
        #: attempts that get no per-attempt fault (those on a verifier-fault task: one fault
        #: per attempt, so that each outcome has one cause); filled by the scripted policy
        #: when it plans the attempt, before its first request
        self.exempt: set[int] = set()
        self._offset = random.Random(f"rollbank-faults:{seed}").randrange(max(1, len(kinds)))

    def planned(self, attempt_seed: int) -> Planned | None:
        """The attempt's fault: whether (``rate``) and when are seeded random; the kind
        rotates with the seed (sibling slots have consecutive seeds), so that every kind
        comes up within a few groups."""
        if not self.kinds or attempt_seed in self.exempt:
            return None
        rng = random.Random(f"rollbank-faults:{self.seed}:{attempt_seed}")
        if rng.random() >= self.rate:
            return None
        # seeds are base + 1009 * group + slot: slot + group picks the kind, so siblings
        # differ and each group shifts by one, whatever the number of kinds (seed + seed //
        # 1009 stepped groups by 1010: no rotation at all over 10 kinds)
        kind = self.kinds[(attempt_seed % 1009 + attempt_seed // 1009 + self._offset)
                          % len(self.kinds)]
        return Planned(kind, rng.randrange(self.turns), round(rng.uniform(0.2, 1.0), 3))
