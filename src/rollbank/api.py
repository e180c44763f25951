"""What rollbank exports: the names a trainer, a benchmark or a user's agent may import.

Import them from here (``from rollbank.api import CollectConfig, collect, read_batch_dir``);
everything else in the package is rollbank's own and may change. Importing this module is
cheap: each name loads its module on first use.

- run a collection: :class:`CollectConfig`, :func:`load_collect_config`, :func:`collect`
  (in-process, async), :func:`run_collect`, :class:`CollectResult`;
- consume batches: :class:`Batch`, :class:`GroupResult`, :func:`read_batch_dir`,
  :func:`table_to_tensors`, :func:`iter_tensor_batches`, :class:`TensorBatch`; from the
  collector service: :class:`CollectorClient`;
- tasks and episodes: :class:`Task`, :func:`load_tasks`, :func:`load_task`,
  :class:`Trajectory`, :class:`EpisodeOutcome`, :class:`Outcome`, :class:`Reason`;
- the seams an agent or a benchmark drives: :class:`Sandbox`, :class:`SandboxBackend`,
  :class:`SandboxSpec`, :class:`Limits`, :class:`ExecResult`; :class:`InferenceClient`,
  :class:`GenerateRequest`, :class:`GenerateResult`, :class:`SamplingParams`,
  :class:`Tokenizer`; :class:`Clock`, :class:`MonotonicClock`, :class:`FakeClock`;
- write an agent program (docs/agents.md): :class:`AgentTask`, :class:`AgentSandbox`,
  :class:`LLM`, :func:`in_own_thread` (its synchronous code on a thread of its own);
- errors: :class:`RollbankError` and its boundary families (exit codes in ``errors.py``);
- :func:`quantile` (the one nearest-rank percentile).

The benchmarks (``rollbank-bench``, ``bench/`` in the repository) also measure rollbank's
parts from the inside: besides these names they may import the public (no leading
underscore) names of the modules in :data:`INSTRUMENTED` — the engines, the scheduler and
the simulator they time — and nothing else (``bench/tests/unit/test_bench_imports.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollbank.agents.contract import LLM as LLM
    from rollbank.agents.contract import AgentSandbox as AgentSandbox
    from rollbank.agents.contract import AgentTask as AgentTask
    from rollbank.agents.contract import in_own_thread as in_own_thread
    from rollbank.batching.batch import Batch as Batch
    from rollbank.batching.batch import GroupResult as GroupResult
    from rollbank.batching.loader import TensorBatch as TensorBatch
    from rollbank.batching.loader import iter_tensor_batches as iter_tensor_batches
    from rollbank.batching.loader import read_batch_dir as read_batch_dir
    from rollbank.batching.loader import table_to_tensors as table_to_tensors
    from rollbank.clock import Clock as Clock
    from rollbank.clock import FakeClock as FakeClock
    from rollbank.clock import MonotonicClock as MonotonicClock
    from rollbank.collect_config import CollectConfig as CollectConfig
    from rollbank.collect_config import load_collect_config as load_collect_config
    from rollbank.collector import CollectResult as CollectResult
    from rollbank.collector import collect as collect
    from rollbank.collector import run_collect as run_collect
    from rollbank.episodes.outcome import EpisodeOutcome as EpisodeOutcome
    from rollbank.episodes.outcome import Outcome as Outcome
    from rollbank.episodes.outcome import Reason as Reason
    from rollbank.episodes.trajectory import Trajectory as Trajectory
    from rollbank.errors import InferenceError as InferenceError
    from rollbank.errors import InputError as InputError
    from rollbank.errors import RollbankError as RollbankError
    from rollbank.errors import SandboxError as SandboxError
    from rollbank.errors import UsageError as UsageError
    from rollbank.inference.protocol import GenerateRequest as GenerateRequest
    from rollbank.inference.protocol import GenerateResult as GenerateResult
    from rollbank.inference.protocol import InferenceClient as InferenceClient
    from rollbank.inference.protocol import SamplingParams as SamplingParams
    from rollbank.inference.protocol import Tokenizer as Tokenizer
    from rollbank.quantiles import quantile as quantile
    from rollbank.sandbox.protocol import ExecResult as ExecResult
    from rollbank.sandbox.protocol import Limits as Limits
    from rollbank.sandbox.protocol import Sandbox as Sandbox
    from rollbank.sandbox.protocol import SandboxBackend as SandboxBackend
    from rollbank.sandbox.protocol import SandboxSpec as SandboxSpec
    from rollbank.service.client import CollectorClient as CollectorClient
    from rollbank.tasks.loader import load_task as load_task
    from rollbank.tasks.loader import load_tasks as load_tasks
    from rollbank.tasks.model import Task as Task

#: name -> the module that defines it (kept equal to the imports above by a test).
EXPORTS: dict[str, str] = {
    "AgentSandbox": "rollbank.agents.contract", "AgentTask": "rollbank.agents.contract",
    "LLM": "rollbank.agents.contract", "in_own_thread": "rollbank.agents.contract",
    "Batch": "rollbank.batching.batch", "GroupResult": "rollbank.batching.batch",
    "TensorBatch": "rollbank.batching.loader", "iter_tensor_batches": "rollbank.batching.loader",
    "read_batch_dir": "rollbank.batching.loader", "table_to_tensors": "rollbank.batching.loader",
    "Clock": "rollbank.clock", "FakeClock": "rollbank.clock", "MonotonicClock": "rollbank.clock",
    "CollectConfig": "rollbank.collect_config", "load_collect_config": "rollbank.collect_config",
    "CollectResult": "rollbank.collector", "collect": "rollbank.collector",
    "run_collect": "rollbank.collector",
    "EpisodeOutcome": "rollbank.episodes.outcome", "Outcome": "rollbank.episodes.outcome",
    "Reason": "rollbank.episodes.outcome", "Trajectory": "rollbank.episodes.trajectory",
    "InferenceError": "rollbank.errors", "InputError": "rollbank.errors",
    "RollbankError": "rollbank.errors", "SandboxError": "rollbank.errors",
    "UsageError": "rollbank.errors",
    "GenerateRequest": "rollbank.inference.protocol", "GenerateResult": "rollbank.inference.protocol",
    "InferenceClient": "rollbank.inference.protocol", "SamplingParams": "rollbank.inference.protocol",
    "Tokenizer": "rollbank.inference.protocol",
    "quantile": "rollbank.quantiles",
    "ExecResult": "rollbank.sandbox.protocol", "Limits": "rollbank.sandbox.protocol",
    "Sandbox": "rollbank.sandbox.protocol", "SandboxBackend": "rollbank.sandbox.protocol",
    "SandboxSpec": "rollbank.sandbox.protocol",
    "CollectorClient": "rollbank.service.client",
    "load_task": "rollbank.tasks.loader", "load_tasks": "rollbank.tasks.loader",
    "Task": "rollbank.tasks.model",
}

__all__ = sorted(EXPORTS)

#: Modules whose public names the benchmarks may import besides :data:`EXPORTS`: what they
#: measure from the inside (engines, sandboxes, the scheduler in virtual time, publication,
#: the trainer step). A benchmark that needs a private name gets it made public instead.
INSTRUMENTED: tuple[str, ...] = (
    "rollbank.agents.contract",
    "rollbank.batching.advantages",
    "rollbank.batching.batch",
    "rollbank.batching.config",
    "rollbank.batching.loader",
    "rollbank.chat.template",
    "rollbank.cli.main",
    "rollbank.clock",
    "rollbank.collect_config",
    "rollbank.collector",
    "rollbank.config",
    "rollbank.episodes.attempt",
    "rollbank.episodes.harnesses.base",
    "rollbank.episodes.outcome",
    "rollbank.episodes.sandboxes",
    "rollbank.episodes.sources",
    "rollbank.episodes.spans",
    "rollbank.episodes.trajectory",
    "rollbank.episodes.workload",
    "rollbank.errors",
    "rollbank.extras",
    "rollbank.gateway.config",
    "rollbank.gateway.gateway",
    "rollbank.gateway.serve",
    "rollbank.gateway.tokens",
    "rollbank.gateway.uvicorn_internals",
    "rollbank.inference.aiohttp_transport",
    "rollbank.inference.config",
    "rollbank.inference.fake",
    "rollbank.inference.fake_client",
    "rollbank.inference.host",
    "rollbank.inference.models",
    "rollbank.inference.prefix_cache",
    "rollbank.inference.process_groups",
    "rollbank.inference.protocol",
    "rollbank.inference.publishing",
    "rollbank.inference.publishing.state",
    "rollbank.inference.server",
    "rollbank.inference.tokenizer",
    "rollbank.inference.vllm_client",
    "rollbank.inference.vllm_http",
    "rollbank.inference_plane",
    "rollbank.metrics.calibrate",
    "rollbank.metrics.events",
    "rollbank.metrics.report",
    "rollbank.quantiles",
    "rollbank.routing.cache_aware",
    "rollbank.routing.config",
    "rollbank.routing.factory",
    "rollbank.routing.router",
    "rollbank.sandbox.config",
    "rollbank.sandbox.local.backend",
    "rollbank.sandbox.local.cgroups",
    "rollbank.sandbox.local.config",
    "rollbank.sandbox.local.proc",
    "rollbank.sandbox.local.sandbox",
    "rollbank.sandbox.pool",
    "rollbank.sandbox.protocol",
    "rollbank.sandbox.ray.backend",
    "rollbank.sandbox.ray.cluster",
    "rollbank.sandbox.ray.config",
    "rollbank.scheduling.config",
    "rollbank.scheduling.drivers.fake",
    "rollbank.scheduling.policy.profile",
    "rollbank.scheduling.policy.scheduler",
    "rollbank.scheduling.sim.sim_model",
    "rollbank.scheduling.sim.simulate",
    "rollbank.scheduling.policy.types",
    "rollbank.staleness.config",
    "rollbank.staleness.gate",
    "rollbank.task_selection",
    "rollbank.tasks.bases",
    "rollbank.tasks.builder",
    "rollbank.tasks.config",
    "rollbank.tasks.loader",
    "rollbank.tasks.model",
    "rollbank.training.config",
    "rollbank.training.correction",
    "rollbank.training.logprobs",
    "rollbank.training.loop_config",
    "rollbank.training.loop_run",
    "rollbank.training.trainer",
)


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollbank.api' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
