"""Agent-shaped trace profiles for ``bench collect`` — a BENCHMARK INSTRUMENT, not rollbank's
workload.

A profile states what a real agent's episode looks like (the *modelled* agent: turns, tokens
per turn, tool output, tool latency, context limit, each figure with its source or marked
assumed) and how the instrument shrinks it to run on this 2-core host while keeping inference,
tools and their tails in proportion. It resolves to the trace workload's fields
(:class:`rollbank.episodes.workload.WorkloadConfig`) and the accel-sim engine's scales
(:mod:`rollbank_bench.accelsim.profile`: ``token_scale``, ``time_scale``).

The instrument's three scales
- ``token_scale`` k: one token on the wire stands for k modelled tokens, in the prompts, the
  outputs and the engine's KV cache and timing (a decode step emitting one token per sequence
  is charged as k steps over contexts k times longer; prefill as k x the uncached tokens).
- ``turn_scale`` m: one scripted turn stands for m agent turns: its output tokens, tool output
  and tool latency are the sum of m agent turns' (Fenton-Wilkinson: the sum of m iid
  lognormals as one lognormal with the same mean and variance). Inference, tool time and prompt
  growth per episode are kept; what is lost is the per-turn round trip count (host cost) and,
  on a prefix-cache miss, the re-prefill of the m - 1 intermediate prompts.
- ``time_scale`` c: the engine's steps and the tools' sleeps last 1/c of their modelled time.
  What is real is NOT compressed: sandbox start/fork, each command's round trip, the verifier
  and rollbank's own work. At c = 30 they stand for 30 x their wall time in the modelled world
  (the measured ~0.37 s pytest verifier stands for ~11 s, a ~30 ms command round trip for
  ~0.9 s — hosted sandboxes take 0.4-0.8 s [R]), and the host's 2 verifier slots (its 2 cores)
  are a capacity a real cluster (a verifier per sandbox) does not have: the verifier term of
  T_LB shows where that binds.

Sources
- [D] yoonholee/terminalbench-trajectories (Hugging Face dataset card, 46,377 Terminal-Bench
  2.0 trials, 89 tasks, 25 scaffolds, 48 models): median 20 steps per trajectory, mean 47.3;
  pass rate 41.3%.
- [R] /work/shared/reference/long-tail-and-lower-bound.md: Terminal-Bench 2.0 with terminus-2
  runs up to 200 turns (episodes), most trials under 50 turns and under 20 minutes, a tail to
  ~100 minutes, most failures among the long runs; observation cut to 10 kB; hosted sandbox
  round trip 0.4-0.8 s per command; SWE agent datasets average 16-64 turns, maxima 42-408.
- [S] nilenso "SWE-Bench Pro trajectory analysis" (2,920 SWE-agent trajectories, 4 models):
  median trajectory length 29-78 steps by model (the SWE regime is longer than TB2's).
- [N] arXiv 2508.03501 (Nebius, multi-turn SWE RL): agents keep coherence "across dozens of
  steps with context windows spanning hundreds of thousands of tokens".
- [T] measured here: the tiny model's tokenizer encodes the commands' printed digits at 0.785
  tokens per character (3,000 characters -> 2,355 tokens).
- ASSUMED (no published per-turn statistic found): output tokens per turn (reasoning models
  write hundreds to thousands, the issue's figure: median 300, sigma 0.9, 16..4096), tool
  output tokens per turn below the 10 kB cut (median 250), tool latency beyond the round trip
  (median 1.5 s, sigma 1.3, up to 120 s: package installs, builds and test suites), and the
  split of the turn spread into a per-task factor (difficulty: every sibling of a hard task is
  long) and a per-attempt one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

TOKENS_PER_CHAR = 0.785  # [T] the tiny tokenizer on `seq -s ' ' 1000 9999` output


@dataclass(frozen=True)
class Lognormal:
    """A lognormal by median and sigma, clamped to ``[lo, hi]``."""

    median: float
    sigma: float
    lo: float = 0.0
    hi: float = math.inf

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma ** 2 / 2)

    def summed(self, m: int) -> Lognormal:
        """The sum of ``m`` iid draws as one lognormal (Fenton-Wilkinson: same mean and
        variance); the clamps scale by ``m``."""
        if m == 1:
            return self
        cv2 = (math.exp(self.sigma ** 2) - 1.0) / m
        sigma = math.sqrt(math.log1p(cv2))
        median = m * self.mean / math.exp(sigma ** 2 / 2)
        return Lognormal(median, sigma, self.lo * m, self.hi * m)

    def scaled(self, f: float) -> Lognormal:
        return Lognormal(self.median * f, self.sigma, self.lo * f, self.hi * f)


@dataclass(frozen=True)
class AgentTrace:
    """One modelled agent (per agent turn) and the instrument's scales."""

    name: str
    turns_median: float  # agent turns per episode
    turns_task_sigma: float
    turns_attempt_sigma: float
    max_turns: int
    output_tokens: Lognormal  # per agent turn
    observation_tokens: Lognormal  # tool output per agent turn
    tool_latency_s: Lognormal  # per agent turn, beyond the sandbox round trip
    context_tokens: int  # the modelled model's context limit
    token_scale: int = 16
    turn_scale: int = 4
    time_scale: float = 30.0

    def with_scales(self, *, token_scale: int | None = None, turn_scale: int | None = None,
                    time_scale: float | None = None) -> AgentTrace:
        from dataclasses import replace

        return replace(self, token_scale=token_scale or self.token_scale,
                       turn_scale=turn_scale or self.turn_scale,
                       time_scale=time_scale or self.time_scale)

    @property
    def max_model_len(self) -> int:
        """The runner's and engine's context limit in wire tokens."""
        return self.context_tokens // self.token_scale

    def workload_fields(self) -> dict[str, Any]:
        """The trace workload's fields (``WorkloadConfig``) for one scripted turn = ``turn_scale``
        agent turns, ``token_scale`` tokens per wire token, ``time_scale`` time compression."""
        m, k, c = self.turn_scale, self.token_scale, self.time_scale
        out = self.output_tokens.summed(m).scaled(1.0 / k)
        obs = self.observation_tokens.summed(m).scaled(1.0 / k / TOKENS_PER_CHAR)
        tool = self.tool_latency_s.summed(m).scaled(1.0 / c)
        return {
            "kind": "trace",
            "turns_median": self.turns_median / m,
            "turns_task_sigma": self.turns_task_sigma,
            "turns_attempt_sigma": self.turns_attempt_sigma,
            "max_turns": max(1, self.max_turns // m),
            "tokens_median": round(out.median, 2),
            "tokens_sigma": round(out.sigma, 4),
            "tokens_min": max(1, math.ceil(out.lo)),
            "tokens_max": max(1, math.floor(out.hi)),
            "observation_chars_median": round(obs.median, 1),
            "observation_chars_sigma": round(obs.sigma, 4),
            "observation_chars_max": min(45_000, math.floor(obs.hi)),
            "tool_latency_median_s": round(tool.median, 4),
            "tool_latency_sigma": round(tool.sigma, 4),
            "tool_latency_max_s": round(tool.hi, 3),
        }

    def describe(self) -> dict[str, Any]:
        """The profile for a report: modelled figures, scales, resolved fields, provenance."""
        d = asdict(self)
        d["label"] = ("benchmark instrument: agent-shaped scripted trace (rollbank_bench.traces); "
                      "the modelled agent's figures are cited or marked assumed in its docstring")
        d["workload"] = self.workload_fields()
        d["max_model_len"] = self.max_model_len
        per_turn = (self.output_tokens.mean / 1.0, self.observation_tokens.mean,
                    self.tool_latency_s.mean)
        d["modelled_means_per_agent_turn"] = {"output_tokens": round(per_turn[0], 1),
                                              "observation_tokens": round(per_turn[1], 1),
                                              "tool_latency_s": round(per_turn[2], 2)}
        return d


TRACES: dict[str, AgentTrace] = {
    # Terminal-Bench 2.0, a reasoning model behind a terminus-2-like scaffold
    "tb2-reasoning": AgentTrace(
        name="tb2-reasoning",
        turns_median=20.0,  # [D] median 20 steps
        turns_task_sigma=1.0,  # assumed split of a total sigma ~1.22: mean/median ~2.1 before
        turns_attempt_sigma=0.7,  # the 200 cap, [D] mean/median 47.3/20 = 2.4
        max_turns=200,  # [R] terminus-2's turn limit
        output_tokens=Lognormal(300.0, 0.9, 16.0, 4096.0),  # ASSUMED (module notes)
        observation_tokens=Lognormal(250.0, 1.0, 0.0, 2500.0),  # hi: [R] 10 kB cut; median ASSUMED
        tool_latency_s=Lognormal(1.5, 1.3, 0.0, 120.0),  # ASSUMED; [R] round trip is the host's
        context_tokens=131_072,  # [N] long contexts; Llama 3.1's limit (the accel-sim profile)
    ),
}


def get_trace(name: str) -> AgentTrace:
    """A profile by name; an unknown name is a usage error naming the known ones."""
    from rollbank.errors import UsageError

    if name not in TRACES:
        raise UsageError(f"--trace-profile {name}: unknown; choose from {', '.join(TRACES)}")
    return TRACES[name]
