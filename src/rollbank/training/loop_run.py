"""Run ``rollbank train``: open the planes, load the trainer, collect with the loop consuming.

:func:`train_with` runs with already-opened planes and any :class:`StepTrainer` (unit tests pass
a fake); :func:`run_train` opens what a :class:`TrainConfig` describes and loads the built-in
trainer. Output folder (``collect.output``), besides what ``rollbank collect`` writes::

    train.resolved.json   the resolved train config
    train.jsonl           one record per step, stale batch and publication (training/loop.py)
    train_summary.json    steps with their publications, stale batches, final versions
    weights/vNNNNNN/      one checkpoint per version (training/checkpoint.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbank.batching.loader import TensorBatch
from rollbank.clock import Clock, MonotonicClock
from rollbank.collector import CollectResult, check_output_folder, collect, plain_printer
from rollbank.config import dump_resolved
from rollbank.episodes.sources import SandboxPlane
from rollbank.inference.protocol import AdmissionGate
from rollbank.inference.publishing.protocol import Publisher
from rollbank.inference_plane import InferencePlane
from rollbank.routing.factory import router_from_config
from rollbank.scheduling.policy.events import EventSink
from rollbank.staleness.config import CorrectionMode, StalenessConfig
from rollbank.task_selection import select_tasks, tasks_to_prepare
from rollbank.tasks.model import Task
from rollbank.training.config import TrainerConfig
from rollbank.training.loop import StepTrainer as StepTrainer  # run_train's wrap_trainer takes one
from rollbank.training.loop import TrainingLoop
from rollbank.training.loop_config import TrainConfig
from rollbank.training.loop_metrics import JsonlRecorder
from rollbank.training.loop_publish import open_train_inference, pattern_publisher

if TYPE_CHECKING:
    from rollbank.training.trainer import Trainer

PublisherFactory = Callable[[InferencePlane, AdmissionGate], Publisher]


@dataclass
class TrainResult:
    out_dir: Path
    collect: CollectResult
    summary: dict[str, Any]


class BuiltinTrainer:
    """The built-in :class:`~rollbank.training.trainer.Trainer` as a :class:`StepTrainer`."""

    def __init__(self, config: TrainerConfig) -> None:
        from rollbank.training.trainer import Trainer

        self.trainer = Trainer.load(config)

    def train(self, batch: TensorBatch) -> dict[str, float]:
        """One step. With ``ratio_against = "recompute"`` and a correction, the batch's weights
        are first re-scored against the trainer's own weights (:func:`rescore_at_step`)."""
        extra: dict[str, float] = {}
        if scores_at_step(self.trainer.config):
            batch, extra = rescore_at_step(self.trainer, batch)
        return {**self.trainer.step(batch).metrics.to_dict(), **extra}

    def save(self, root: Path, version: int) -> Path:
        return self.trainer.save(root, version)

    def tensors(self) -> Mapping[str, Any]:
        """A detached copy of the published weights (the LoRA adapter's for a LoRA policy)."""
        from rollbank.training.logprobs import causal_lm

        model = self.trainer.model
        if self.trainer.config.finetune == "lora":
            import peft

            state = peft.get_peft_model_state_dict(model)
        else:
            state = causal_lm(model).state_dict()
        return {k: v.detach().clone() for k, v in state.items()}


def scores_at_step(config: TrainerConfig) -> bool:
    """Whether the loop's step re-scores a batch's correction against the trainer's weights:
    the ratio is taken against the trainer's recompute and a correction is on."""
    return config.ratio_against == "recompute" and config.correction.mode is not CorrectionMode.NONE


def rescore_at_step(trainer: Trainer, batch: TensorBatch) -> tuple[TensorBatch, dict[str, float]]:
    """``batch`` with its importance weights and keep mask computed from the trainer's own
    log-probs now (one no-grad forward) against the behaviour log-probs, and what they were.

    A batch's ``is_weights`` as written by collection estimate ``pi / mu`` for the engines'
    weights when its group completed (the gate in collection scores then); in async training
    the batch then waits, up to ``loop.max_lag`` versions, and the trainer's policy moves on.
    The correction belongs to the policy the step updates (TIS: ``min(pi_theta / mu, C)``), as
    verl's rollout correction recomputes it with the actor. The gate's row weights stay."""
    from rollbank.training.correction import recompute_scoring

    scoring = recompute_scoring(batch, trainer.logprobs(batch), current_version=trainer.steps,
                                config=StalenessConfig(correction=trainer.config.correction))
    c = scoring.report.get("correction") or {}
    d = scoring.divergence
    extra = {"correction_frac_masked": float(c.get("frac_masked", 0.0)),
             "correction_frac_truncated": float(c.get("frac_truncated", 0.0)),
             "correction_weight_mean": float(c.get("weight_mean", 0.0)),
             "trainer_k3_mean": float(d.traj_k3_mean), "trainer_k3_max": float(d.traj_k3_max)}
    return scoring.with_weights(batch), extra


def batches_ahead(config: TrainConfig) -> int:
    """How many batches collection may finish while the trainer is busy: in async mode
    ``loop.max_lag`` (the admission gate bounds the lag; a hand-off of one batch would stop
    the collector ~3 versions ahead whatever ``max_lag`` says), in sync one (admission is
    closed from each hand-off until its version is served)."""
    return max(1, config.loop.max_lag) if config.loop.mode == "async" else 1


def _remember(config: TrainConfig, plane: InferencePlane) -> Callable[[str, int], None] | None:
    """What tells managed servers the version a restarted one must serve: the full
    checkpoint, or (LoRA) the adapter under the name the lora pattern published it as."""
    if config.trainer.finetune == "full":
        return plane.remember_weights
    adapter = plane.remember_adapter
    if adapter is None:
        return None
    from rollbank.inference.publishing.lora import adapter_name

    return lambda path, version: adapter(adapter_name(version), path, version)


async def train_with(
    config: TrainConfig,
    *,
    tasks: Sequence[Task],
    inference: InferencePlane,
    sandboxes: SandboxPlane,
    out_dir: Path,
    trainer: StepTrainer,
    make_publisher: PublisherFactory | None = None,
    progress: Callable[[str], None] | None = None,
    clock: Clock | None = None,
    setup_s: float = 0.0,
    extra_sinks: Sequence[EventSink] = (),
) -> TrainResult:
    """Collect ``loop.steps`` batches, training and publishing after each (see training/loop.py)."""
    clock = clock or MonotonicClock()
    check_output_folder(out_dir)
    dump_resolved(config, out_dir, "train.resolved.json")
    servers = list(inference.clients)
    gate = AdmissionGate()
    publisher = await asyncio.to_thread(make_publisher or pattern_publisher(config), inference, gate)
    for c in inference.clients.values():  # every client waits on the loop's gate
        c.set_admission(gate)
    router = router_from_config(config.collect.router, servers, clock)
    recorders: list[Callable[[dict[str, Any]], None]] = [JsonlRecorder(out_dir / "train.jsonl")]
    sinks = list(extra_sinks)
    collect_config = config.collect
    async with contextlib.AsyncExitStack() as stack:
        port = collect_config.metrics.prometheus_port
        if port is not None:  # one endpoint for collection and training metrics
            from rollbank.metrics.prometheus import PrometheusSink
            from rollbank.training.loop_metrics import TrainGauges

            prom = PrometheusSink()
            recorders.append(TrainGauges(prom.registry))
            bound = prom.serve(port)
            stack.callback(prom.close)
            sinks.append(prom)
            if progress is not None:
                progress(f"Prometheus metrics on http://127.0.0.1:{bound}/metrics")
            collect_config = collect_config.model_copy(update={
                "metrics": collect_config.metrics.model_copy(update={"prometheus_port": None})})

        def record(rec: dict[str, Any]) -> None:
            for r in recorders:
                r(rec)

        remember = _remember(config, inference)
        loop = TrainingLoop(config.loop, trainer, publisher, gate=gate, servers=servers,
                            weights_root=out_dir / "weights", router=router, record=record,
                            progress=progress, clock=clock, remember=remember)
        try:
            result = await collect(collect_config, tasks=tasks, inference=inference,
                                   sandboxes=sandboxes, out_dir=out_dir, clock=clock,
                                   extra_sinks=[loop, *sinks], setup_s=setup_s, router=router,
                                   on_batch=loop.on_batch, batches_ahead=batches_ahead(config))
            await loop.finish()
        finally:
            await loop.aclose()
            await publisher.aclose()  # e.g. the direct pattern's /dev/shm buffers
    summary = {**loop.summary(), "setup_s": setup_s, "collection_s": result.collection_s,
               "ledger": result.ledger}
    (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return TrainResult(out_dir, result, summary)


async def run_train(config: TrainConfig, *, out_dir: Path | None = None,
                    progress: Callable[[str], None] | None = None,
                    wrap_trainer: Callable[[StepTrainer], StepTrainer] | None = None
                    ) -> TrainResult:
    """Open the planes and the trainer ``config`` describes, train, release everything.

    ``wrap_trainer``: what the loop trains with instead of the built-in trainer, given it
    (an instrument's seam: the learning bench paces the trainer like a larger model's)."""
    from rollbank.episodes.sandboxes import open_sandboxes

    out = out_dir or Path(config.collect.output)
    check_output_folder(out)
    tasks = select_tasks(config.collect)
    t_setup = time.monotonic()
    say = plain_printer(config.collect)  # plain lines off a terminal, as `rollbank collect`
    if say is not None:
        say(f"loading the trainer ({config.trainer.model}) while servers start...")
    async with contextlib.AsyncExitStack() as stack:
        # The colocated engine is imported and built in this process: loading the trainer in another
        # thread at the same time imports transformers/accelerate from two threads at once, and
        # Python's per-module import locks then hand one of them a partially initialised module
        # ("cannot import name 'AlignDevicesHook' from partially initialized module
        # 'accelerate.hooks'"). The trainer loads first there; servers in other processes overlap.
        trainer_task = asyncio.create_task(asyncio.to_thread(BuiltinTrainer, config.trainer))
        if config.loop.publisher == "colocated":
            await asyncio.wait({trainer_task})  # its error, if any, is raised below
        try:
            plane = await stack.enter_async_context(open_train_inference(config, say=say))
            sandboxes = await stack.enter_async_context(
                open_sandboxes(config.collect.sandbox, tasks,
                               prepare=tasks_to_prepare(config.collect, tasks)))
            trainer: StepTrainer = await trainer_task
        finally:
            if not trainer_task.done():
                trainer_task.cancel()
                await asyncio.gather(trainer_task, return_exceptions=True)
        if wrap_trainer is not None:
            trainer = wrap_trainer(trainer)
        return await train_with(config, tasks=tasks, inference=plane, sandboxes=sandboxes,
                                out_dir=out, trainer=trainer, progress=progress,
                                setup_s=time.monotonic() - t_setup)
