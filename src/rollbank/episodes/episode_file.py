"""The typed episode file (schema ``rollbank.episode/1``): what replay reads.

:func:`parse_episode` validates a decoded JSON object against :class:`EpisodeFile`; a file
with the right schema tag and a missing or malformed key is an
:class:`~rollbank.errors.InputError` naming the file and the dotted field, never a
``KeyError`` deep in replay. Unknown keys are ignored (later writers may add some).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollbank.config import read_json_input
from rollbank.episodes.outcome import EpisodeOutcome, Outcome, Reason
from rollbank.errors import InputError

SCHEMA = "rollbank.episode/1"


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)  # NaN/inf: no limit, no reward


class StepEntry(_Record):
    """One model turn as recorded."""

    index: int = Field(ge=0, description="turn index")
    model_text: str = Field(description="the model's text, replayed as is")
    action: str | None = Field(default=None, description="the command text parsed from it")
    observation: str = Field(default="", description="what was fed back to the model")
    exit_code: int | None = Field(default=None, description="exit code of the last command")
    timed_out: bool = Field(default=False, description="the last command hit the step timeout")
    task_step: int | None = Field(default=None, description="task step of the turn (multi-step)")


class TaskStepEntry(_Record):
    """One step of a multi-step task as recorded (absent for single-step tasks)."""

    index: int = Field(ge=0, description="step index in the task's [[steps]]")
    name: str = Field(description="step name")
    reward: float | None = Field(default=None, description="the step verifier's scalar")
    rewards: dict[str, float] = Field(default_factory=dict, description="its named rewards")
    outcome: Outcome = Field(description="the step's own verdict")
    reason: Reason = Field(description="the step's reason code")
    loop_end: str | None = Field(default=None, description="how the step's agent turns ended")
    first_turn: int = Field(default=0, ge=0, description="index of the step's first turn")
    turns: int = Field(default=0, ge=0, description="model turns spent on the step")
    passed_min_reward: bool = Field(default=True, description="the step cleared min_reward")


class OutcomeEntry(_Record):
    """The recorded verdict (its reason must imply its outcome)."""

    outcome: Outcome = Field(description="model_success / model_failure / infra_failure / unknown")
    reason: Reason = Field(description="closed vocabulary, see episodes/outcome.py")
    reward: float | None = Field(default=None, description="the verifier's scalar")
    rewards: dict[str, float] = Field(default_factory=dict, description="named rewards")
    evidence: dict[str, Any] = Field(default_factory=dict, description="what the verdict rests on")

    def to_outcome(self) -> EpisodeOutcome:
        return EpisodeOutcome(self.outcome, self.reason, self.reward, dict(self.rewards),
                              dict(self.evidence))

    @property
    def loop_end(self) -> str | None:
        end = self.evidence.get("loop_end")
        return end if isinstance(end, str) else None


class RunnerLimits(_Record):
    """The runner limits the episode ran under (replay uses the same)."""

    step_timeout_s: float = Field(default=30.0, gt=0, description="per-command timeout")
    use_shell: bool = Field(default=True, description="persistent shell session")
    episode_budget_s: float | None = Field(default=None, description="tool-time budget")
    health_probe_timeout_s: float = Field(default=10.0, gt=0, description="probe deadline")
    replay_cap_s: float = Field(default=60.0, gt=0, description="attribution replay cap (wall s)")


class EpisodeFile(_Record):
    """One episode file."""

    schema_: Literal["rollbank.episode/1"] = Field(alias="schema", description="schema tag")
    trajectory_id: str = Field(description="attempt id")
    group_id: str = Field(description="GRPO group id")
    task_id: str = Field(description="task id")
    task_path: str = Field(description="task folder at collection time")
    task_hash: str = Field(description="content hash of the task folder")
    layer_hashes: list[str] = Field(default_factory=list, description="environment layers")
    seed: int = Field(default=0, description="sampling seed")
    harness: str | None = Field(default=None, description="harness name")
    workdir: str | None = Field(default=None, description="commands' working directory")
    runner: RunnerLimits = Field(default_factory=RunnerLimits, description="runner limits")
    steps: list[StepEntry] = Field(default_factory=list, description="model turns in order")
    task_steps: list[TaskStepEntry] = Field(
        default_factory=list, description="per-step verdicts of a multi-step task, in order")
    outcome: OutcomeEntry | None = Field(default=None, description="the recorded verdict")


def read_episode(path: Path) -> EpisodeFile:
    """Read and validate the episode file at ``path``: every failure (missing, a directory,
    not UTF-8, not JSON, NaN/Infinity, nested too deeply, a bad field) is an
    :class:`InputError` naming the file (exit 3), never a traceback."""
    return parse_episode(read_json_input(path, what="episode file"), file=path)


def parse_episode(data: object, *, file: Path | None = None) -> EpisodeFile:
    """Validate a decoded episode file; errors name the file and the first bad field."""
    if not isinstance(data, dict):
        raise InputError("an episode file must hold a JSON object", file=file)
    if data.get("schema") != SCHEMA:
        raise InputError(f"unknown schema {data.get('schema')!r} (expected {SCHEMA})",
                         file=file, field="schema")
    try:
        record = EpisodeFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        raise InputError(f"{err['msg']} ({exc.error_count()} problem(s))", file=file,
                         field=where) from exc
    if record.outcome is not None:
        try:
            record.outcome.to_outcome()
        except ValueError as exc:
            raise InputError(str(exc), file=file, field="outcome.reason") from exc
    return record
