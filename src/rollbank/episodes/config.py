"""Configuration of the episode layer: the runner's limits and the sandbox plane (where an
episode's sandbox comes from), apart from their implementations so that loading a
configuration does not load the runner or the sandbox backend."""

from __future__ import annotations

from pydantic import Field

from rollbank.config import Section
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.ray.config import RaySandboxConfig
from rollbank.tasks.config import BuilderConfig


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
