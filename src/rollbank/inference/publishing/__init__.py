"""Weight publication behind one :class:`Publisher` seam: checkpoint, direct, colocated, lora
(the one stack: the training loop, serve-collector and the benchmark use it).

Heavy imports (torch, vLLM) stay inside the pattern modules' functions."""

from rollbank.inference.publishing.checkpoint import CheckpointPublisher, write_checkpoint
from rollbank.inference.publishing.colocated import ColocatedEngine, ColocatedPublisher
from rollbank.inference.publishing.direct import DirectPublisher
from rollbank.inference.publishing.fleet import Fleet
from rollbank.inference.publishing.lora import LoraPublisher
from rollbank.inference.publishing.protocol import (
    PLAN_TO_PAUSE,
    InflightPlan,
    Pattern,
    PublicationRecord,
    Publisher,
    WeightUpdate,
    update_of,
)
from rollbank.inference.publishing.state import ServedWeights

__all__ = [
    "PLAN_TO_PAUSE",
    "CheckpointPublisher",
    "ColocatedEngine",
    "ColocatedPublisher",
    "DirectPublisher",
    "Fleet",
    "InflightPlan",
    "LoraPublisher",
    "Pattern",
    "PublicationRecord",
    "Publisher",
    "ServedWeights",
    "WeightUpdate",
    "update_of",
    "write_checkpoint",
]
