"""One arm of the learning-integrity experiment: GRPO on the addition family at a fixed lag.

Step ``t`` (the trainer holds version ``t``) trains on the prompts ``step_tasks(seed, t)``,
``group_size`` attempts each, sampled by version ``max(0, t - lag)``: the steady state of an
asynchronous loop whose batches are ``lag`` versions old (``lag = 0`` is synchronous). Per
step the arm records the training reward, the divergence of the batch against the trainer's
current weights (trainer recompute: k3, ESS, geometric ratio, lag histogram), the gate's
decisions and the time spent sampling / scoring / training; every ``eval_every`` steps the
current weights are evaluated on a fixed task set.

Arms (:class:`ArmSpec`):
- ``gated``: before the step, the batch is scored with the trainer's recompute; the
  :class:`~rollbank.staleness.gate.StalenessGate` judges every trajectory of each group;
  a dropped one (verdict ``retry``) has its slot re-sampled by the current version, like an
  infra retry, so the group stays complete; down-weighted rows carry ``gate_weight``; the
  loss applies token TIS (``min(rho, C)``) with the ratio taken against the recompute.
- ungated: the same stale batch is trained on as if it were on-policy (ratio against the
  recompute, no weights): its divergence is still measured, after the fact, from the
  step's own recompute (``StepResult.logprobs``), and reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rollbank.batching.advantages import grpo_advantages
from rollbank.batching.config import AdvantageConfig
from rollbank.batching.loader import TensorBatch
from rollbank.staleness.config import CorrectionConfig, CorrectionMode, GateConfig, StalenessConfig
from rollbank.staleness.gate import GateCounters, GateInput, StalenessGate
from rollbank.training.config import TrainerConfig
from rollbank.training.correction import RecomputeScoring, recompute_scoring
from rollbank.training.trainer import Trainer
from rollbank_bench.learning.policy import (
    Sample,
    TextCodec,
    VersionStore,
    behaviour_logprobs,
    expected_solve_rates,
    sample,
    to_batch,
)
from rollbank_bench.learning.tasks import AdditionTask, eval_tasks, step_tasks


@dataclass(frozen=True)
class ArmSpec:
    name: str
    lag: int
    gated: bool


@dataclass(frozen=True)
class Settings:
    """Sizes shared by every arm of one run."""

    steps: int
    prompts: int  # groups per step
    group_size: int
    lr: float
    max_new_tokens: int
    eval_every: int
    eval_size: int
    seed: int
    threads: int
    tis_cap: float = 2.0
    levels: tuple[int, ...] = (1, 2, 3)  # task levels of the training prompts and the eval set
    eval_metric: str = "sampled"  # "sampled": one sample per eval task; "expected": its probability
    kl_coef: float = 0.0  # weight of k3 KL to the warmed-up weights (the base), every arm alike
    max_grad_norm: float = 1.0  # global gradient-norm clip of every arm (0: none)


def trainer_config(settings: Settings, correction: CorrectionConfig, model_dir: Path) -> TrainerConfig:
    """The trainer of one arm: full fine-tuning from ``model_dir`` (the warmed-up weights, which
    are also the KL reference when ``kl_coef > 0``), PPO ratio against the recompute; only
    ``correction`` differs between arms."""
    return TrainerConfig(
        model=str(model_dir), finetune="full", lr=settings.lr, ratio_against="recompute",
        correction=correction, micro_batch_size=settings.prompts * settings.group_size,
        seed=settings.seed, threads=settings.threads, max_grad_norm=settings.max_grad_norm,
        kl_coef=settings.kl_coef,
    )


def _record_divergence(scoring: RecomputeScoring) -> dict[str, Any]:
    d = scoring.divergence
    return {"k3": d.tokens.k3, "k1": d.tokens.k1, "ess": d.tokens.ess, "seq_ess": d.seq_ess,
            "geo_ratio": d.tokens.geo_ratio, "traj_k3_mean": d.traj_k3_mean,
            "traj_k3_max": d.traj_k3_max, "traj_ess_min": d.traj_ess_min,
            "max_abs_log_rho": d.tokens.max_abs_log_rho,
            "version_lag_histogram": {str(k): v for k, v in d.version_lag_histogram.items()}}


class ArmRunner:
    """Runs one :class:`ArmSpec` from the warmed-up weights ``model_dir``."""

    def __init__(self, spec: ArmSpec, settings: Settings, model_dir: Path,
                 log: Callable[[str], None] = lambda _m: None) -> None:
        self.spec, self.s, self.log = spec, settings, log
        mode = CorrectionMode.TOKEN_TIS if spec.gated else CorrectionMode.NONE
        self.correction = CorrectionConfig(mode=mode, tis_cap=settings.tis_cap)
        self.staleness = StalenessConfig(correction=self.correction,
                                         gate=GateConfig(enabled=spec.gated))
        self.trainer = Trainer.load(trainer_config(settings, self.correction, model_dir))
        self.codec = TextCodec(model_dir)
        self.store = VersionStore(keep=spec.lag + 1)
        self.store.publish(0, self.trainer.model)
        self.gate = StalenessGate(self.staleness.gate)
        self.counters = GateCounters()
        self._eval = eval_tasks(settings.eval_size, tuple(settings.levels))

    # ------------------------------------------------------------ pieces
    def _sample(self, tasks: Sequence[AdditionTask], version: int, seed: int) -> list[Sample]:
        return sample(self.store.get(version), self.codec, tasks, version=version, seed=seed,
                      max_new_tokens=self.s.max_new_tokens)

    def _batch(self, samples: Sequence[Sample], step: int) -> TensorBatch:
        g = self.s.group_size
        adv: list[float] = []
        for k in range(0, len(samples), g):
            adv.extend(grpo_advantages([x.reward for x in samples[k:k + g]], AdvantageConfig()).advantages)
        ids = [f"s{step}/g{i // g}/r{i % g}" for i in range(len(samples))]
        batch = to_batch(samples, adv, [i // g for i in range(len(samples))], ids)
        old = behaviour_logprobs(self.store, batch, [x.version for x in samples])
        return replace(batch, old_logprobs=old)

    def _gate(self, samples: list[Sample], batch: TensorBatch, step: int, seed: int
              ) -> tuple[list[Sample], dict[str, float], dict[str, Any], dict[str, Any],
                         RecomputeScoring | None]:
        """Judge every group; re-sample retried slots with the current version. Returns the
        final samples, the gate weight per kept trajectory id (1 if absent), the gate's
        counts, the divergence of the batch before the gate, and the batch's scoring when
        no slot was re-sampled (the batch is then unchanged: no second recompute)."""
        current = self.trainer.logprobs(batch)
        scoring = recompute_scoring(batch, current, current_version=step, config=self.staleness)
        g = self.s.group_size
        retry: list[int] = []
        weights: dict[int, float] = {}
        step_counts = GateCounters()
        for k in range(0, len(samples), g):
            inputs = [GateInput(batch.trajectory_ids[i], i - k, samples[i].reward > 0,
                                scoring.divergence.per_trajectory[batch.trajectory_ids[i]],
                                version_lag=step - samples[i].version) for i in range(k, k + g)]
            decision = self.gate.decide_group(f"s{step}/g{k // g}", inputs)
            step_counts.add_group(decision)
            self.counters.add_group(decision)
            retry.extend(k + slot for slot in decision.retry_slots)
            for d in decision.kept:
                weights[k + d.slot] = d.weight
        out = list(samples)
        if retry:  # the dropped slots are re-run by the current policy (fresh: divergence 0)
            fresh = self._sample([samples[i].task for i in retry], step, seed + 7919)
            for i, x in zip(retry, fresh, strict=True):
                out[i] = x
                weights[i] = 1.0
        counts = step_counts.to_dict()
        return (out, {batch.trajectory_ids[i]: w for i, w in weights.items()}, counts,
                _record_divergence(scoring), None if retry else scoring)

    def evaluate(self, version: int) -> dict[str, Any]:
        """Eval of ``version`` on the fixed task set: ``sampled_solve_rate`` (one sample per
        task, fixed seed), ``expected_solve_rate`` (mean probability of the canonical correct
        completion, no sampling noise) and ``solve_rate``, the one ``eval_metric`` names (the
        curves, ``auc`` and the verdict use it); ``by_level`` for the same metric."""
        model = self.store.get(version)
        samples = self._sample(self._eval, version, 10_000_019)
        expected = expected_solve_rates(model, self.codec, self._eval,
                                        max_new_tokens=self.s.max_new_tokens)
        chosen = expected if self.s.eval_metric == "expected" else [x.reward for x in samples]
        by: dict[int, list[float]] = {}
        for task, v in zip(self._eval, chosen, strict=True):
            by.setdefault(task.level, []).append(v)
        sampled = sum(x.reward for x in samples) / len(samples)
        return {"version": version, "solve_rate": sum(chosen) / len(chosen),
                "sampled_solve_rate": sampled, "expected_solve_rate": sum(expected) / len(expected),
                "by_level": {str(k): sum(v) / len(v) for k, v in sorted(by.items())}}

    # ------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        s, spec = self.s, self.spec
        steps: list[dict[str, Any]] = []
        evals = [self.evaluate(0) | {"step": 0, "samples": 0}]
        samples_seen = 0
        t_start = time.perf_counter()
        for step in range(s.steps):
            t0 = time.perf_counter()
            seed = hash((s.seed, step)) & 0x7FFFFFFF
            tasks = [t for t in step_tasks(s.seed, step, s.prompts, tuple(s.levels))
                     for _ in range(s.group_size)]
            behaviour = max(0, step - spec.lag)
            samples = self._sample(tasks, behaviour, seed)
            batch = self._batch(samples, step)
            t1 = time.perf_counter()
            gate_counts: dict[str, Any] | None = None
            pre: dict[str, Any] | None = None
            if spec.gated:
                samples, gate_w, gate_counts, pre, unchanged = self._gate(samples, batch, step,
                                                                          seed)
                if unchanged is not None:
                    scoring = unchanged
                else:  # slots re-sampled: the batch changed, score it again
                    batch = self._batch(samples, step)
                    scoring = recompute_scoring(batch, self.trainer.logprobs(batch),
                                                current_version=step, config=self.staleness)
                gw = torch.tensor([gate_w.get(t, 1.0) for t in batch.trajectory_ids])
                batch = replace(scoring.with_weights(batch), gate_weight=gw)
            t2 = time.perf_counter()
            result = self.trainer.step(batch)
            t3 = time.perf_counter()
            if not spec.gated:
                scoring = recompute_scoring(batch, result.logprobs, current_version=step,
                                            config=self.staleness)
            self.store.publish(step + 1, self.trainer.model)
            samples_seen += len(samples)
            zero_var = sum(1 for k in range(0, len(samples), s.group_size)
                           if len({x.reward for x in samples[k:k + s.group_size]}) == 1)
            rec: dict[str, Any] = {
                "step": step, "samples": samples_seen, "behaviour_version": behaviour,
                "lag": step - behaviour,
                "reward": sum(x.reward for x in samples) / len(samples),
                "zero_variance_groups": zero_var,
                "divergence": _record_divergence(scoring),
                "divergence_before_gate": pre, "gate": gate_counts,
                "loss": result.metrics.loss, "grad_norm": result.metrics.grad_norm,
                "kl_to_base": result.metrics.kl,
                "sample_seconds": t1 - t0, "score_seconds": t2 - t1, "train_seconds": t3 - t2,
                "wall": time.perf_counter() - t_start,
            }
            steps.append(rec)
            if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
                evals.append(self.evaluate(step + 1) | {"step": step + 1, "samples": samples_seen,
                                                        "wall": time.perf_counter() - t_start})
                self.log(f"{spec.name} step {step + 1}: train reward {rec['reward']:.3f}, "
                         f"eval {evals[-1]['solve_rate']:.3f}, k3 {rec['divergence']['k3']:.4f}")
        return {"arm": spec.name, "lag": spec.lag, "gated": spec.gated,
                "correction": self.correction.mode.value, "steps": steps, "evals": evals,
                "gate_totals": self.counters.to_dict() if spec.gated else None,
                "wall_seconds": time.perf_counter() - t_start}
