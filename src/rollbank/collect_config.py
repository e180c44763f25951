"""Configuration of ``rollbank collect`` (one pydantic section per component).

People write TOML (``configs/collect.toml`` is the embedded default); :func:`load_collect_config`
validates it, and the collector writes the resolved config beside the run's outputs.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rollbank.agents.config import AgentConfig
from rollbank.config import Origins, Section, apply_overrides, read_toml, validate
from rollbank.episodes.config import RunnerConfig, SandboxSection
from rollbank.episodes.harnesses import (
    AnswerLineConfig,
    AnswerLineHarness,
    ChatConfig,
    FencedShellConfig,
    FencedShellHarness,
    Harness,
    Terminus2Config,
    Terminus2Harness,
)
from rollbank.episodes.workload import WorkloadConfig
from rollbank.gateway.config import GatewaySection
from rollbank.inference.config import ServerConfig
from rollbank.routing.config import RouterConfig
from rollbank.scheduling.config import SchedulerConfig
from rollbank.staleness.config import StalenessConfig

DEFAULT_CONFIG = "collect.toml"


class InferenceSection(Section):
    """Where tokens come from."""

    kind: Literal["managed", "external", "fake"] = Field(
        default="managed", description="managed: start vLLM servers; external: use `urls`; fake: "
        "in-process fake servers (tests, CI smoke without vLLM)",
    )
    managed: ServerConfig = Field(
        default_factory=lambda: ServerConfig.model_validate({}), description="managed vLLM servers (kind = managed)"
    )
    urls: list[str] = Field(default_factory=list, description="server base URLs (kind = external)")
    tokenizer: str | None = Field(
        default=None, description="model folder (or 'tiny'/'gemma-3-270m') whose tokenizer the external "
        "servers use (kind = external)",
    )
    external_versions: Literal["auto", "engine", "rollbank"] = Field(
        default="auto", description="where per-token weight versions come from (kind = external): "
        "engine (the server reports them: a vLLM started with VLLM_SERVER_DEV_MODE=1, and "
        "--enable-scale-out for per-token spans); rollbank (rollbank's own publication records, "
        "for a standard `vllm serve`: tokens carry the version rollbank last published to that "
        "server, 0 until it publishes); auto: engine when the server reports a version, else "
        "rollbank, said at start",
    )
    fake_servers: int = Field(default=2, ge=1, description="number of fake servers (kind = fake)")
    fake_decode_s_per_token: float = Field(
        default=0.0, ge=0, description="simulated decode latency per token (kind = fake)"
    )
    fake_prefill_s_per_token: float = Field(
        default=0.0, ge=0, description="simulated prefill latency per uncached token (kind = fake)"
    )
    calibrate: bool = Field(
        default=True, description="measure the servers' capacity (for the lower bound) before collecting"
    )
    calibration_max_age_s: float = Field(
        default=86400.0, ge=0, description="reuse a calibration of the same managed servers (host, "
        "model, dtype, servers, threads, engine) measured at most this long ago, from "
        "ROLLBANK_CACHE/calibration (the summary's capacity.source says 'cached:...'); 0: always probe",
    )


class MetricsSection(Section):
    """What the run reports while and after it runs."""

    live: Literal["auto", "on", "off"] = Field(
        default="auto", description="rich live progress on stderr (auto: only on a terminal)"
    )
    prometheus_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve Prometheus metrics on this port (0: any free)"
    )
    report: bool = Field(
        default=True, description="write report.html with plots at the end (needs rollbank[report])"
    )
    tensorboard: bool = Field(
        default=False, description="write TensorBoard event files of the run's scalar series "
        "(attempt/*, batch/*) under <output>/tensorboard (needs rollbank[tensorboard])",
    )
    wandb: bool = Field(
        default=False, description="log the same series to Weights & Biases in offline mode under "
        "<output>/wandb, never contacting a server; upload later with `wandb sync` "
        "(needs rollbank[wandb])",
    )
    record_episodes: bool = Field(
        default=True, description="write one replayable episode file per attempt under episodes/"
    )


class CollectConfig(Section):
    """``rollbank collect``: tasks x model -> trainable batches, events, report."""

    tasks: list[str] = Field(
        default_factory=lambda: ["terminal-lite"],
        description="task folders, folders of tasks, or built-in suite names",
    )
    include: list[str] = Field(
        default_factory=list, description="only these task ids (empty: all)"
    )
    exclude_costs: list[str] = Field(
        default_factory=list, description="skip tasks whose [metadata] cost is one of these"
    )
    exclude_saturated_from: str | None = Field(
        default=None, description="a task-health file (`rollbank tasks health --out`): skip the "
        "tasks it lists as saturated (always solved: no learning signal)",
    )
    task_order_seed: int | None = Field(
        default=0, description="shuffle the task sequence with this seed (None: name order); group seq "
        "k runs task k mod len(tasks)",
    )
    output: str = Field(default="runs/collect", description="output folder (batches, events, report)")
    harness: Literal["fenced-shell", "terminus-2", "answer-line", "agent", "chat"] = Field(
        default="fenced-shell", description="agent protocol ('answer-line': the instruction is "
        "the prompt and the one completion the command, for a model fitted to that format; "
        "'agent': an agent program, [agent], through the OpenAI-compatible gateway; "
        "'chat': a chat model with tool calls, rendered by its own chat template, [chat])"
    )
    chat: ChatConfig = Field(
        default_factory=lambda: ChatConfig.model_validate({}),
        description="chat harness settings (template, tool-call format, few-shot, tokens; "
        "docs/chat.md)",
    )
    agent: AgentConfig = Field(
        default_factory=lambda: AgentConfig.model_validate({}),
        description="harness = agent: the agent program (entry 'module:function'), its limits "
        "and options (docs/agents.md)",
    )
    gateway: GatewaySection = Field(
        default_factory=lambda: GatewaySection.model_validate({}),
        description="harness = agent: the gateway the agents speak to (tool-call format, request "
        "limits, default/cap of max_tokens; docs/gateway.md); serve-gateway's sessions, "
        "records_dir and admin token do not apply",
    )
    fenced_shell: FencedShellConfig = Field(
        default_factory=lambda: FencedShellConfig.model_validate({}),
        description="fenced-shell harness settings (tokens per turn, temperature)",
    )
    answer_line: AnswerLineConfig = Field(
        default_factory=lambda: AnswerLineConfig.model_validate({}),
        description="answer-line harness settings (tokens, temperature)",
    )
    terminus2: Terminus2Config = Field(
        default_factory=lambda: Terminus2Config.model_validate({}),
        description="terminus-2 harness settings",
    )
    workload: WorkloadConfig = Field(
        default_factory=lambda: WorkloadConfig.model_validate({}),
        description="who decides actions: the model, or a seeded Terminal-Bench-shaped trace",
    )
    runner: RunnerConfig = Field(default_factory=lambda: RunnerConfig.model_validate({}), description="episode limits")
    scheduler: SchedulerConfig = Field(
        default_factory=lambda: SchedulerConfig.model_validate({}), description="groups, capacities, straggler policy"
    )
    router: RouterConfig = Field(default_factory=RouterConfig, description="routing policy")
    inference: InferenceSection = Field(
        default_factory=lambda: InferenceSection.model_validate({}), description="inference servers"
    )
    sandbox: SandboxSection = Field(default_factory=lambda: SandboxSection.model_validate({}), description="sandboxes")
    metrics: MetricsSection = Field(default_factory=lambda: MetricsSection.model_validate({}), description="reporting")
    staleness: StalenessConfig = Field(
        default_factory=StalenessConfig,
        description="divergence measurement, corrections, and the staleness gate in collection "
        "(staleness.collection.enabled, off by default: docs/staleness.md)",
    )

    @model_validator(mode="after")
    def _context_fits_the_servers(self) -> CollectConfig:
        served = self.inference.managed.max_model_len
        if self.inference.kind == "managed" and self.runner.max_model_len > served:
            raise ValueError(
                f"runner.max_model_len ({self.runner.max_model_len}) exceeds the managed servers' "
                f"inference.managed.max_model_len ({served}): prompts would be refused mid-episode")
        return self


def make_harness_for(config: CollectConfig) -> Harness:
    if config.harness == "terminus-2":
        return Terminus2Harness(config.terminus2)
    if config.harness == "answer-line":
        return AnswerLineHarness(config.answer_line)
    if config.harness == "chat":
        inf = config.inference
        served = inf.managed.model if inf.kind == "managed" else inf.tokenizer
        from rollbank.episodes.harnesses.chat import ChatHarness  # templates: not at config load

        return ChatHarness(config.chat, model=served)
    return FencedShellHarness(config.fenced_shell)


def default_config_text() -> str:
    return resources.files("rollbank.configs").joinpath(DEFAULT_CONFIG).read_text()


#: The embedded default's task selection is tuned for its own suite and model: a user who
#: names other tasks (``--tasks``) or another model (``--model``) gets all of what they named,
#: unless they also set these keys themselves.
EMBEDDED_SELECTION_KEYS = ("include", "exclude_costs")
SELECTION_OWNERS = ("tasks", "inference.managed.model")


def drop_embedded_selection(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` (the embedded default) without its ``include``/``exclude_costs`` when the user
    gave ``--tasks`` or ``--model`` and not those keys."""
    if any(k in overrides for k in SELECTION_OWNERS):
        for key in EMBEDDED_SELECTION_KEYS:
            if key not in overrides:
                data.pop(key, None)
    return data


def load_collect_config(path: Path | None = None, overrides: dict[str, Any] | None = None,
                        origins: Origins | None = None) -> CollectConfig:
    """The embedded default, or ``path``; then dotted ``overrides`` (``"scheduler.seed": 3``).

    ``origins`` says which flag gave each override, so that an error names the flag.
    """
    data, source = read_toml(path, default_text=default_config_text(), default_name=DEFAULT_CONFIG)
    if path is None:
        data = drop_embedded_selection(data, overrides or {})
    data = apply_overrides(data, overrides or {}, origins)
    return validate(CollectConfig, data, source=source, overrides=overrides, origins=origins)
