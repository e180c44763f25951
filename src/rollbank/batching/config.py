"""Configuration of the batching layer (how a group's rewards become advantages), apart from
its implementation so that loading a configuration stays light."""

from __future__ import annotations

from pydantic import Field

from rollbank.config import Section


class AdvantageConfig(Section):
    """GRPO advantages over the valid (trainable) siblings of a group."""

    normalize_std: bool = Field(
        default=True,
        description="divide (r - mean) by the group's std (GRPO); false: Dr. GRPO style",
    )
    eps: float = Field(default=1e-6, gt=0, description="added to the std before dividing")
    failure_reward: float = Field(
        default=0.0, description="reward of a model_failure whose verifier wrote no reward"
    )
    success_reward: float = Field(
        default=1.0, description="reward of a model_success whose verifier wrote no reward"
    )
