"""Trace workload: Terminal-Bench-shaped episodes whose actions are scripted, not the model's.

A scheduling benchmark needs episodes whose lengths and tool latencies look like an agent's on
Terminal-Bench (a heavy tail of long trajectories, wall-clock tool time), and the same ones in
every arm. A small model on a CPU does not produce that: the tiny test model never writes a
valid command, so every episode runs to ``max_turns`` with no tool time and there is no tail.
With ``kind = "trace"`` the runner keeps everything real — prompts and generated tokens from
the served model (with log-probs and policy versions), the router, the sandbox, the shell, the
verifier — and takes from a seeded plan only what the model would decide: how many turns the
episode has, how many tokens each turn generates (``min_tokens = max_tokens``, no stop
strings), and how long each turn's command keeps the sandbox busy (``sleep`` run in the
sandbox: wall-clock tool latency that costs no CPU, as a command running on generously
provisioned sandbox CPU would). The episode ends ``done`` after its last turn and is verified
for real (the scripted commands change nothing, so rewards are the task's no-op reward).

Invariants
- A plan depends only on ``(config, task_id, attempt seed)``: retries of a slot and every arm
  of a benchmark replay the same plan (attempt seeds depend on the group's seq and the slot).
- Turn counts are lognormal with a per-task factor (hard tasks are long for every sibling) and
  a per-attempt factor, clamped to ``[1, max_turns]``; tool latencies are lognormal, clamped.

Calibration (``../shared/reference/long-tail-and-lower-bound.md``): Terminal-Bench 2.0 runs with
terminus-2 have most trials under 50 turns and 20 minutes with a tail to ~100 minutes (max /
median ~ 10); hosted sandboxes take 0.4-0.8 s per command round trip. The defaults compress
that about 30x in time and 4x in turns for a 2-core machine: median 8 turns, median 1.5 s per
command, episode duration median ~16 s, p90 ~46 s, max ~125 s (p90 / median 2.9).

Agent-shaped traces (``rollbank_bench.traces``, a benchmark instrument) also set
``tokens_median`` (lognormal tokens per turn instead of uniform ``tokens_min..tokens_max``)
and ``observation_chars_median`` (each command prints that many characters after its sleep,
so prompts grow by tool output as an agent's do). Left at their defaults, plans are exactly
the ones above (same random draws).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import Field, model_validator

from rollbank.config import Section
from rollbank.episodes.harnesses.base import Action, ActionKind, Command
from rollbank.inference.protocol import SamplingParams


class WorkloadConfig(Section):
    """Who decides the episode's actions: the model (``model``) or a seeded trace (``trace``)."""

    kind: Literal["model", "trace"] = Field(
        default="model",
        description="model: the harness parses the model's text into actions; trace: a seeded "
        "Terminal-Bench-shaped plan decides turns, tokens per turn and tool latency (see "
        "rollbank.episodes.workload)",
    )
    seed: int = Field(default=0, description="seed of the trace plans (with task id and attempt seed)")
    turns_median: float = Field(default=4.0, gt=0, description="median turns per episode")
    turns_task_sigma: float = Field(
        default=0.7, ge=0, description="lognormal sigma of the per-task turn factor (task difficulty)"
    )
    turns_attempt_sigma: float = Field(
        default=0.5, ge=0, description="lognormal sigma of the per-attempt turn factor (siblings differ)"
    )
    max_turns: int = Field(default=48, ge=1, description="turns are clamped to this (replaces runner.max_turns)")
    tool_latency_median_s: float = Field(
        default=5.0, ge=0, description="median seconds one turn's command holds the sandbox"
    )
    tool_latency_sigma: float = Field(default=0.8, ge=0, description="lognormal sigma of tool latency")
    tool_latency_max_s: float = Field(default=30.0, ge=0, description="tool latency is clamped to this")
    tokens_min: int = Field(default=4, ge=1, description="fewest tokens a turn generates")
    tokens_max: int = Field(default=16, ge=1, description="most tokens a turn generates")
    tokens_median: float | None = Field(
        default=None, gt=0,
        description="median tokens per turn, lognormal with tokens_sigma, clamped to "
        "[tokens_min, tokens_max] (None: uniform in [tokens_min, tokens_max])",
    )
    tokens_sigma: float = Field(default=0.0, ge=0, description="lognormal sigma of tokens per turn")
    observation_chars_median: float = Field(
        default=0.0, ge=0,
        description="median characters a turn's command prints after its sleep (lognormal "
        "with observation_chars_sigma; 0: it prints nothing)",
    )
    observation_chars_sigma: float = Field(
        default=0.0, ge=0, description="lognormal sigma of the characters a command prints"
    )
    observation_chars_max: int = Field(
        default=10_000, ge=0, le=45_000, description="characters printed are clamped to this"
    )

    @model_validator(mode="after")
    def _ordered(self) -> WorkloadConfig:
        if self.tokens_min > self.tokens_max:
            raise ValueError(f"tokens_min ({self.tokens_min}) > tokens_max ({self.tokens_max})")
        return self


@dataclass(frozen=True)
class TurnPlan:
    """One scripted turn: generate exactly ``tokens`` tokens, then hold the sandbox ``tool_s``
    and print ``obs_chars`` characters (deterministic digits and spaces)."""

    tokens: int
    tool_s: float
    obs_chars: int = 0

    def sampling(self, base: SamplingParams, room: int) -> SamplingParams:
        """``base`` forced to ``tokens`` tokens (at most ``room``): no stop strings or EOS."""
        n = max(1, min(self.tokens, room))
        return replace(base, max_tokens=n, min_tokens=n, stop=(), stop_token_ids=())

    def command(self) -> Command:
        if self.obs_chars <= 0:
            return Command(f"sleep {self.tool_s:.3f}")
        return Command(f"sleep {self.tool_s:.3f}; seq -s ' ' 1000 9999 | head -c {self.obs_chars}")


@dataclass(frozen=True)
class EpisodePlan:
    turns: tuple[TurnPlan, ...]

    def action(self, turn: int) -> Action:
        """The scripted action of ``turn``: its command; the last turn also ends the episode."""
        kind = ActionKind.DONE if turn >= len(self.turns) - 1 else ActionKind.COMMANDS
        return Action(kind, (self.turns[turn].command(),))

    @property
    def tool_s(self) -> float:
        return sum(t.tool_s for t in self.turns)

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.turns)


_TWOPI = 2.0 * math.pi  # random.TWOPI


class TraceWorkload:
    """Plans episodes for ``kind = "trace"`` (pure: no I/O, no clock)."""

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        self._task_factor: dict[str, float] = {}

    def task_factor(self, task_id: str) -> float:
        f = self._task_factor.get(task_id)
        if f is None:
            rng = random.Random(f"rollbank-trace:{self.config.seed}:{task_id}")
            f = self._task_factor[task_id] = math.exp(rng.gauss(0.0, self.config.turns_task_sigma))
        return f

    def plan(self, task_id: str, seed: int) -> EpisodePlan:
        return EpisodePlan(tuple(TurnPlan(*t) for t in self.turn_values(task_id, seed)))

    def turn_values(self, task_id: str, seed: int) -> list[tuple[int, float, int]]:
        """``(tokens, tool_s, obs_chars)`` of each planned turn, without the plan objects (the
        simulator's hot path). The draws are ``random.Random``'s own, inlined: ``gauss`` (with
        its cached second value) and ``randint`` (``_randbelow_with_getrandbits``), so every
        value is bit-identical to calling those methods (pinned by the plan digest test)."""
        c = self.config
        rng = random.Random(f"rollbank-trace:{c.seed}:{task_id}:{seed}")
        uniform, bits = rng.random, rng.getrandbits
        exp, log, sqrt, cos, sin = math.exp, math.log, math.sqrt, math.cos, math.sin
        x2pi = uniform() * _TWOPI  # gauss: a pair per two draws
        g2rad = sqrt(-2.0 * log(1.0 - uniform()))
        spare: float | None = sin(x2pi) * g2rad
        turns = c.turns_median * self.task_factor(task_id) * exp(
            0.0 + cos(x2pi) * g2rad * c.turns_attempt_sigma)
        n = max(1, min(c.max_turns, round(turns)))
        lognormal_tokens = c.tokens_median is not None
        t_lo, t_width = c.tokens_min, c.tokens_max - c.tokens_min + 1
        t_bits = t_width.bit_length()
        lat_median, lat_sigma, lat_max = (c.tool_latency_median_s, c.tool_latency_sigma,
                                          c.tool_latency_max_s)
        obs_median = c.observation_chars_median
        out: list[tuple[int, float, int]] = []
        for _ in range(n):
            if not lognormal_tokens:
                r = bits(t_bits)
                while r >= t_width:
                    r = bits(t_bits)
                tokens = t_lo + r
            else:
                if spare is None:
                    x2pi = uniform() * _TWOPI
                    g2rad = sqrt(-2.0 * log(1.0 - uniform()))
                    z, spare = cos(x2pi) * g2rad, sin(x2pi) * g2rad
                else:
                    z, spare = spare, None
                drawn = round(c.tokens_median * exp(0.0 + z * c.tokens_sigma))  # type: ignore[operator]
                tokens = max(c.tokens_min, min(c.tokens_max, drawn))
            if spare is None:
                x2pi = uniform() * _TWOPI
                g2rad = sqrt(-2.0 * log(1.0 - uniform()))
                z, spare = cos(x2pi) * g2rad, sin(x2pi) * g2rad
            else:
                z, spare = spare, None
            lat = lat_median * exp(0.0 + z * lat_sigma)
            obs = 0
            if obs_median > 0:
                if spare is None:
                    x2pi = uniform() * _TWOPI
                    g2rad = sqrt(-2.0 * log(1.0 - uniform()))
                    z, spare = cos(x2pi) * g2rad, sin(x2pi) * g2rad
                else:
                    z, spare = spare, None
                obs = min(c.observation_chars_max, round(
                    obs_median * exp(0.0 + z * c.observation_chars_sigma)))
            out.append((tokens, round(min(lat_max, lat), 3), obs))
        return out


def make_workload(config: WorkloadConfig) -> TraceWorkload | None:
    """The planner for ``kind = "trace"``; None when the model decides (``kind = "model"``)."""
    return TraceWorkload(config) if config.kind == "trace" else None
