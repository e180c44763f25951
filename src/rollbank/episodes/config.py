"""Configuration of the episode layer: the runner's limits and the sandbox plane (where an
episode's sandbox comes from), apart from their implementations so that loading a
configuration does not load the runner or the sandbox backend."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollbank.config import Section
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.ray.config import RaySandboxConfig
from rollbank.tasks.config import BuilderConfig

#: Default cap (bytes) on one observation a harness shows the model.
DEFAULT_OBSERVATION_LIMIT = 10_000
#: How the Terminus-2 harness frames its transcript (see ``harnesses.terminus2``).
Framing = Literal["plain", "chatml", "gemma"]


class RunnerConfig(Section):
    """Limits of one episode."""

    max_turns: int = Field(default=8, ge=1, description="model turns before the episode ends (max_turns); with a trace "
        "workload the plan's turn count replaces it")
    step_timeout_s: float = Field(
        default=30.0, gt=0, description="per-command timeout inside the sandbox (the command is killed)"
    )
    episode_budget_s: float | None = Field(
        default=None, gt=0,
        description="seconds of command execution per episode (the model's tool time; the "
        "verifier is not charged); None: the task's agent_timeout_s",
    )
    step_timeout_ends_episode: bool = Field(
        default=False, description="end the episode (step_timeout, model_failure) when a command times "
        "out; false: the model sees the timeout and may continue",
    )
    max_model_len: int = Field(default=2048, ge=64, description="the served model's context (tokens)")
    min_new_tokens: int = Field(
        default=16, ge=1, description="if fewer tokens fit in the context, the episode ends (context)"
    )
    use_shell: bool = Field(
        default=True, description="run commands in one persistent shell (cwd/env survive between steps)"
    )
    verifier_slots: int | None = Field(
        default=None, ge=1,
        description="verifiers running at once, when scheduler.verifier_slots is unset (the "
        "scheduler owns the slots and lends them through the attempt context; CPU-bound test "
        "suites: more than the cores makes each slower); None: the CPU count",
    )
    health_probe_timeout_s: float = Field(
        default=10.0, gt=0, description="deadline of the trivial command that probes a sandbox on "
        "an error path (episodes/counterfactual.py): the episode's, and a pristine fork's",
    )
    replay_cap_s: float = Field(
        default=60.0, gt=0, description="wall seconds the attribution replay (the model's "
        "actions re-run on a pristine fork, episodes/counterfactual.py) may take; cut: unknown",
    )


class SandboxSection(Section):
    """Where episodes run."""

    warm: bool = Field(
        default=True, description="fork each episode from a warm pool snapshot of its task (false: build "
        "the environment and start a cold sandbox per episode, the naive baseline)",
    )
    cold_rebuild: bool = Field(
        default=True, description="with warm = false, rebuild the task's layers per episode in a fresh "
        "layer cache (the base filesystem stays cached), as a docker build per episode would",
    )
    local: LocalSandboxConfig = Field(
        default_factory=LocalSandboxConfig, description="local backend settings"
    )
    ray: RaySandboxConfig = Field(
        default_factory=RaySandboxConfig,
        description="Ray backend settings: with ray.address set, sandboxes run on the Ray "
        "cluster's CPU nodes (each node applies the local settings) and the scheduler's "
        "sandbox slots follow the cluster's",
    )
    builder: BuilderConfig = Field(
        default_factory=lambda: BuilderConfig.model_validate({}), description="environment builder settings"
    )


ToolFormat = Literal["auto", "hermes", "llama3_json", "pythonic"]


class ChatConfig(Section):
    """The chat harness (docs/chat.md)."""

    max_tokens: int = Field(default=256, ge=1, description="Token budget of one model turn.")
    temperature: float = Field(default=0.7, ge=0.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    template: str | None = Field(
        default=None, description="model name or folder whose chat template renders the chat "
        "(None: the served model's: inference.managed.model, or inference.tokenizer)")
    tool_format: ToolFormat = Field(
        default="auto", description="tool-call family the model writes: hermes (<tool_call>), "
        "llama3_json, pythonic; auto: llama3_json for a Llama-3 template, else hermes")
    few_shot: bool = Field(default=True, description="put a worked example task (tool calls and "
                           "results) in the chat before the task")
    lenient: bool = Field(default=True, description="run a fenced ```bash block as a shell call "
                          "(recorded as not a well-formed tool call)")
    observation_limit_bytes: int = Field(
        default=10_000, ge=256,
        description="tool output beyond this many UTF-8 bytes keeps head and tail and a marker")


class FencedShellConfig(Section):
    """Sampling and formatting of the fenced-shell harness."""

    max_tokens: int = Field(default=192, ge=1, description="Token budget of one model turn.")
    temperature: float = Field(default=0.8, ge=0.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    observation_limit_bytes: int = Field(
        default=DEFAULT_OBSERVATION_LIMIT, ge=256,
        description="Observations longer than this (UTF-8 bytes) keep head and tail and a "
        "marker saying how much was dropped.",
    )


class AnswerLineConfig(Section):
    """Sampling of the answer-line harness."""

    max_tokens: int = Field(default=12, ge=1, description="Token budget of the one completion.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")


class Terminus2Config(Section):
    """Sampling and formatting of the Terminus-2 JSON harness."""

    max_tokens: int = Field(default=1024, ge=1, description="Token budget of one model turn.")
    temperature: float = Field(default=0.7, ge=0.0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    framing: Framing = Field(
        default="plain",
        description="Turn markers: plain text, or the chatml / gemma chat turn tokens.",
    )
    observation_limit_bytes: int = Field(
        default=DEFAULT_OBSERVATION_LIMIT, ge=256,
        description="Terminal output beyond this many UTF-8 bytes keeps head and tail and a "
        "marker (Terminus-2 cuts at 10 kB).",
    )
    max_duration_s: float = Field(
        default=60.0, gt=0.0, description="Upper bound applied to a command's requested duration."
    )
