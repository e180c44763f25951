"""Configuration of collection scheduling: the scheduler, the ready bank, advantages.

One pydantic :class:`~rollbank.config.Section` per component, every field documented.
:meth:`SchedulerConfig.effective` resolves ``mode = "naive"`` into the baseline's settings so
the policy code reads one set of numbers.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from rollbank.batching.config import AdvantageConfig
from rollbank.config import Section

__all__ = ["AdvantageConfig", "ReadyBankConfig", "SchedulerConfig"]


class StragglerPolicy(StrEnum):
    """What happens to unfinished attempts once a batch has enough complete groups."""

    WAIT = "wait"  # the batch is emitted only when every group in the pool is terminal
    CARRY = "carry"  # emit now; unfinished attempts keep running and join the next batch
    ABORT = "abort"  # emit now; unfinished attempts are cancelled and reported as waste


class SchedulingMode(StrEnum):
    """``optimized``: ready bank, over-provisioning, priorities. ``naive``: the baseline.

    ``naive`` is a launch-order synchronous batch: exactly ``groups_per_batch`` groups are
    launched per batch (no over-provisioning), the batch waits for all of them, waiting
    attempts are served first-come-first-served (no sibling priority), an infra failure is not
    re-run (retry limit 0), and a dropped group is not replaced (the batch is smaller).
    """

    OPTIMIZED = "optimized"
    NAIVE = "naive"


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling (verl's ``filter_groups``), bounded: complete groups whose rewards
    have zero variance are held back in the bank while groups with variance go first."""

    enabled: bool = Field(
        default=False,
        description="hold back complete zero-variance groups; release groups with reward "
        "variance first; a held group is replaced by a new group (up to max_extra_groups)",
    )
    max_extra_groups: int = Field(
        default=4, ge=0,
        description="at most this many groups beyond pool_groups are admitted to replace "
        "held zero-variance groups; once no group is open, the held groups are released so "
        "a batch always comes",
    )
    max_hold_s: float | None = Field(
        default=None, gt=0,
        description="also release the held groups once the oldest has waited this long "
        "(the driver polls again at that time; None: no time bound)",
    )


class ReadyBankConfig(Section):
    """When a group is complete, when a slot is re-run, which groups a trainer receives."""

    group_size: int = Field(default=8, ge=1, description="siblings per GRPO group (n)")
    max_retries: int = Field(
        default=2, ge=0, description="re-runs of a sibling slot after infra_failure/unknown"
    )
    min_valid: int = Field(
        default=2,
        ge=1,
        description="a complete group with fewer valid siblings is dropped as waste",
    )
    filter_zero_variance: bool = Field(
        default=False,
        description="drop complete groups whose valid rewards are all equal (as waste)",
    )
    advantages: AdvantageConfig = Field(
        default_factory=AdvantageConfig, description="how advantages are computed"
    )
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig,
        description="hold back zero-variance groups, release groups with variance first (bounded)",
    )


    @model_validator(mode="after")
    def _consistent(self) -> ReadyBankConfig:
        if self.min_valid > self.group_size:
            raise ValueError(f"min_valid ({self.min_valid}) > group_size ({self.group_size})")
        if self.filter_zero_variance and self.group_size < 2:
            raise ValueError("filter_zero_variance would drop every group of size 1")
        if self.dynamic_sampling.enabled and self.filter_zero_variance:
            raise ValueError("dynamic_sampling holds zero-variance groups back while "
                             "filter_zero_variance drops them: choose one")
        if self.dynamic_sampling.enabled and self.group_size < 2:
            raise ValueError("dynamic_sampling would hold back every group of size 1")
        return self


class SchedulerConfig(Section):
    """Launch policy: capacities, over-provisioning, straggler policy, batch count."""

    mode: SchedulingMode = Field(
        default=SchedulingMode.OPTIMIZED, description="optimized collector or the naive baseline"
    )
    groups_per_batch: int = Field(default=32, ge=1, description="G: complete groups per batch")
    pool_groups: int = Field(
        ge=1,
        description="G' >= G: groups launched and not yet consumed or discarded (over-provisioning); "
        "unset: ceil(1.5 x groups_per_batch), the best G'/G of `rollbank bench schedule` here",
    )
    straggler: StragglerPolicy = Field(
        default=StragglerPolicy.CARRY,
        description="wait | carry | abort (unfinished attempts at a batch)",
    )
    hold_extras_when_contended: bool = Field(
        default=True,
        description="launch attempts of groups beyond the next batch's need only while no "
        "generate call waits for an inference slot and no episode waits for a verifier slot "
        "(work-conserving over-provisioning)",
    )
    hold_extras_for_verifier: bool = Field(
        default=True,
        description="with hold_extras_when_contended: a verifier-slot wait also holds extras "
        "back (true; needed where extras' inference and sandboxes share the verifiers' CPU, the "
        "vLLM CPU regime). False: only an inference-slot wait does, and the verifier queue "
        "(ordered by group completion) absorbs the extras' verifications — in the accelerator "
        "regime (`bench collect --engine accel-sim`) holding extras for a busy verifier only "
        "delays them (`rollbank bench schedule --from-measured`, docs/collect.md)",
    )
    requeue_aborted: bool = Field(
        default=True,
        description="re-queue the task of an aborted group at its original place (FIFO)",
    )
    max_requeues: int | None = Field(
        default=3,
        ge=0,
        description="with straggler = abort and requeue_aborted: re-queue one group's task at "
        "most this many times; after that it is recorded unreachable within the batch budget "
        "(task_unreachable event, Batch.unreachable, summary) and not re-queued again "
        "(None: no cap)",
    )
    sandbox_slots: int = Field(default=64, ge=1, description="attempts holding a sandbox at once")
    inference_slots_per_server: int = Field(
        default=16,
        ge=1,
        description="concurrent generate requests per server (one limiter per server)",
    )
    verifier_slots: int | None = Field(
        default=None,
        ge=1,
        description="verifiers running at once, granted to the group closest to complete "
        "first (None: no limit; the collector sets runner.verifier_slots or the CPU count)",
    )
    num_batches: int = Field(default=1, ge=1, description="batches to collect before closing")
    max_groups: int | None = Field(
        default=None,
        ge=1,
        description="stop launching new groups after this many (None: unlimited)",
    )
    seed: int = Field(
        default=0, description="base seed; an attempt's seed depends on (seed, seq, slot)"
    )
    bank: ReadyBankConfig = Field(
        default_factory=ReadyBankConfig, description="ready bank settings"
    )

    @model_validator(mode="before")
    @classmethod
    def _default_pool(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("pool_groups") is None:
            groups = data.get("groups_per_batch", cls.model_fields["groups_per_batch"].default)
            if isinstance(groups, int) and groups >= 1:
                data = {**data, "pool_groups": math.ceil(1.5 * groups)}
        return data

    @model_validator(mode="after")
    def _pool_covers_batch(self) -> SchedulerConfig:
        if self.mode is SchedulingMode.OPTIMIZED and self.pool_groups < self.groups_per_batch:
            raise ValueError(
                f"pool_groups ({self.pool_groups}) must be >= groups_per_batch "
                f"({self.groups_per_batch})"
            )
        return self

    def effective(self) -> SchedulerConfig:
        """The settings the policy actually uses (naive mode forces the baseline's)."""
        if self.mode is SchedulingMode.OPTIMIZED:
            return self
        bank = self.bank.model_copy(update={"max_retries": 0, "filter_zero_variance": False,
                                         "dynamic_sampling": DynamicSamplingConfig()})
        return self.model_copy(
            update={
                "pool_groups": self.groups_per_batch,
                "straggler": StragglerPolicy.WAIT,
                "requeue_aborted": False,
                "bank": bank,
            }
        )
