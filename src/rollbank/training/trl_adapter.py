"""TRL adapter: rollbank collects, TRL's ``GRPOTrainer`` trains.

TRL (tested with ``trl==1.16.0``) lets a ``GRPOTrainer`` take its rollouts from outside through
``rollout_func(prompts, trainer) -> dict``: ``prompts`` is the per-process slice of the
generation batch, each dataset prompt repeated ``num_generations`` times in a row, and the
function returns one completion per entry. :class:`RollbankRollouts` is such a function: it
ignores the prompt text (rollbank, not TRL's dataset, decides which tasks run; use
:func:`placeholder_dataset`) and answers ``len(prompts) / num_generations`` complete rollbank
GRPO groups, in the order rollbank delivered them, from

- a batch directory (:func:`groups_from_batch_dirs`; optionally waiting for the batches a
  ``rollbank collect`` in another process is still writing), or
- a running in-process collection (:class:`BatchStream` over ``CollectionDriver.batches()``,
  then :func:`groups_from_batches`).

Mapping (rollbank schema-v1 column -> TRL field), one TRL row per rollbank trajectory:

==========================================  =================================================
rollbank                                    TRL
==========================================  =================================================
``token_ids[:prompt_len]``                  ``prompt_ids``
``token_ids[prompt_len:]``                  ``completion_ids`` (model and environment tokens)
``logprobs[prompt_len:]``                   ``logprobs`` (behaviour log-probs; TRL keeps them as
                                            ``sampling_per_token_logps``)
``loss_mask[prompt_len:]``                  ``env_mask`` (TRL's tool mask: 1 = model token)
``reward``                                  ``rollbank_reward`` extra field, returned by the
                                            reward function :func:`rollbank_reward`
``advantage``                               ``rollbank_advantage`` extra field
                                            (:func:`rollbank_advantage`)
``trajectory_id``, ``group_id``,            ``rollbank_trajectory_id``, ``rollbank_group_id``,
``task_id``, ``max_version``                ``rollbank_task_id``, ``rollbank_max_version``
rows of one ``group_id``                    ``num_generations`` consecutive rows (one group)
==========================================  =================================================

Rewards and advantages. TRL recomputes advantages from the rewards over the same groups. With
``scale_rewards="none"`` and rollbank's ``normalize_std = false`` both are ``r - mean(r)`` over
the group. With ``scale_rewards="group"`` TRL divides by the Bessel-corrected std + 1e-4
(rollbank: population std + ``eps``). To train on rollbank's advantages verbatim, use
:func:`rollbank_advantage` as the only reward function with ``scale_rewards="none"``: rollbank's
advantages already have zero mean in each group, so TRL's centring leaves them unchanged.

Behaviour log-probs. TRL 1.16 uses ``sampling_per_token_logps`` in the loss only for its vLLM
importance-sampling correction and the off-policy sequence mask (``off_policy_mask_threshold``);
its PPO ratio is over its own recompute (``old_per_token_logps``). Keep
``mask_truncated_completions=False``: a rollbank completion often ends on an environment token,
which TRL would read as truncation. An empty completion is sent as one masked pad token.

Invariants
- Only trainable trajectories reach TRL: rollbank's batches hold only ``model_success`` /
  ``model_failure`` rows (infra-failed attempts left the batch and the group baseline), and a
  row with any other outcome is refused here (:class:`SchemaError`).
- Groups are never split or mixed: a group whose valid siblings are fewer than
  ``num_generations`` (slots that stayed infra-failed after the retry limit) is skipped whole
  and listed in :attr:`RollbankRollouts.skipped`; a group size other than ``num_generations``
  is a configuration error.
- One process: each ``RollbankRollouts`` serves the groups of its own source.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from rollbank.batching.batch import Batch
from rollbank.batching.loader import read_batch_dir
from rollbank.batching.schema import SchemaError, batch_to_table, check_schema
from rollbank.batching.writer import MANIFEST_NAME, batch_dir_name
from rollbank.errors import ConfigError, RollbankError

TRAINABLE = frozenset({"model_success", "model_failure"})
_COLUMNS = ["trajectory_id", "group_id", "task_id", "token_ids", "logprobs", "loss_mask",
            "prompt_len", "reward", "advantage", "group_size", "outcome", "max_version"]


class RolloutsExhaustedError(RollbankError):
    """The rollout source has no further complete group for TRL."""


@dataclass(frozen=True)
class RolloutRow:
    """One rollbank trajectory, split at its prompt the way TRL wants it."""

    trajectory_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float
    advantage: float
    max_version: int


@dataclass(frozen=True)
class RolloutGroup:
    """One GRPO group: its valid siblings in slot order and its size (slots)."""

    group_id: str
    task_id: str
    size: int
    rows: tuple[RolloutRow, ...]


def groups_from_table(table: pa.Table) -> list[RolloutGroup]:
    """The groups of a schema-v1 table (rows of a group are contiguous, in slot order)."""
    check_schema(table.schema)
    groups: list[RolloutGroup] = []
    current: list[dict[str, Any]] = []
    for rec in [*table.select(_COLUMNS).to_pylist(), None]:
        if current and (rec is None or rec["group_id"] != current[0]["group_id"]):
            first = current[0]
            groups.append(RolloutGroup(first["group_id"], first["task_id"],
                                       int(first["group_size"]), tuple(map(_row, current))))
            current = []
        if rec is not None:
            current.append(rec)
    return groups


def _row(rec: dict[str, Any]) -> RolloutRow:
    if rec["outcome"] not in TRAINABLE:
        raise SchemaError(f"{rec['trajectory_id']}: outcome {rec['outcome']!r} is not trainable")
    p = int(rec["prompt_len"])
    ids, lps, mask = rec["token_ids"], rec["logprobs"], rec["loss_mask"]
    if not 0 <= p <= len(ids):
        raise SchemaError(f"{rec['trajectory_id']}: prompt_len {p} outside 0..{len(ids)}")
    return RolloutRow(rec["trajectory_id"], list(ids[:p]), list(ids[p:]),
                      [float(x) for x in lps[p:]], [int(m) for m in mask[p:]],
                      float(rec["reward"]), float(rec["advantage"]), int(rec["max_version"]))


def groups_from_batches(batches: Iterable[Batch]) -> Iterator[RolloutGroup]:
    """Groups of in-process batches (the same rows the batch directory would hold)."""
    for batch in batches:
        yield from groups_from_table(batch_to_table(batch))


def groups_from_batch_dirs(
    root: Path, *, start: int = 0, wait_s: float = 0.0, poll_s: float = 0.5,
    verify: bool = True, sleep: Callable[[float], None] = time.sleep,
) -> Iterator[RolloutGroup]:
    """Groups of ``root/batch-NNNNNN`` from index ``start`` on, in index order.

    A missing next batch ends the iteration, after waiting up to ``wait_s`` seconds for it to
    appear (a collection still writing). Each directory is checked (manifest, sha256, schema).
    """
    index, waited = start, 0.0
    while True:
        path = root / batch_dir_name(index)
        if (path / MANIFEST_NAME).is_file():
            yield from groups_from_table(read_batch_dir(path, verify=verify))
            index, waited = index + 1, 0.0
        elif waited < wait_s:
            sleep(poll_s)
            waited += poll_s
        else:
            return


class BatchStream:
    """Iterate, from synchronous code such as TRL's loop, an async source of batches.

    ``open_batches`` (e.g. ``lambda: driver.batches()``, or an async generator that opens the
    inference and sandbox planes and yields from a driver) runs on its own event loop in a
    background thread, so collection goes on while TRL trains. At most ``ahead`` batches wait
    here undelivered. :meth:`close` (or leaving the ``with`` block) cancels the source, which
    aborts its attempts, and joins the thread. An error of the source is raised by ``next``.
    """

    def __init__(self, open_batches: Callable[[], AsyncGenerator[Batch, None]], *,
                 ahead: int = 1) -> None:
        if ahead < 1:
            raise ValueError("ahead must be >= 1")
        self._open = open_batches
        self._items: queue.Queue[Batch | BaseException | None] = queue.Queue()
        self._room = threading.Semaphore(ahead)
        self._closing = threading.Event()
        self._started = threading.Event()
        self._done = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="rollbank-batch-stream",
                                        daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.run(self._pump())

    async def _pump(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        self._started.set()
        end: BaseException | None = None
        try:
            async with contextlib.aclosing(self._open()) as batches:
                while True:
                    await asyncio.to_thread(self._room.acquire)
                    if self._closing.is_set():
                        break
                    try:
                        batch = await anext(batches)
                    except StopAsyncIteration:
                        break
                    self._items.put(batch)
        except asyncio.CancelledError:
            pass  # closed by the consumer
        except Exception as exc:  # handed to the consumer, which raises it
            end = exc
        finally:
            self._items.put(end)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        if self._done:
            raise StopIteration
        item = self._items.get()
        if item is None or isinstance(item, BaseException):
            self._done = True
            if item is None:
                raise StopIteration
            raise item
        self._room.release()
        return item

    def close(self) -> None:
        """Stop the source (attempts still running are aborted) and join the thread."""
        self._closing.set()
        self._room.release()  # wakes a pump waiting for room
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)
        self._thread.join()
        self._done = True

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class RollbankRollouts:
    """A TRL ``rollout_func`` answering complete rollbank groups from ``groups``.

    Pass it as ``GRPOTrainer(rollout_func=RollbankRollouts(...), reward_funcs=[rollbank_reward])``
    with ``num_generations`` equal to rollbank's group size. ``served`` lists the groups handed
    to TRL in order; ``skipped`` the ids of groups left out for missing valid siblings.
    """

    groups: Iterable[RolloutGroup]
    served: list[RolloutGroup] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._it = iter(self.groups)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        training = bool(getattr(trainer.model, "training", True))
        g = int(trainer.num_generations if training else trainer.num_generations_eval)
        if len(prompts) % g:
            raise ValueError(f"{len(prompts)} prompts is not a multiple of num_generations {g}")
        pad = trainer.processing_class.pad_token_id
        groups = [self._next_group(g) for _ in range(len(prompts) // g)]
        self.served.extend(groups)
        rows = [r for grp in groups for r in grp.rows]
        out: dict[str, list[Any]] = {
            # an empty completion (no model token) becomes one masked pad token for TRL
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.completion_ids or [int(pad)] for r in rows],
            "logprobs": [r.logprobs or [0.0] for r in rows],
            "env_mask": [r.env_mask or [0] for r in rows],
            "rollbank_reward": [r.reward for r in rows],
            "rollbank_advantage": [r.advantage for r in rows],
            "rollbank_trajectory_id": [r.trajectory_id for r in rows],
            "rollbank_group_id": [grp.group_id for grp in groups for _ in grp.rows],
            "rollbank_task_id": [grp.task_id for grp in groups for _ in grp.rows],
            "rollbank_max_version": [r.max_version for r in rows],
        }
        return out

    def _next_group(self, g: int) -> RolloutGroup:
        for group in self._it:
            if group.size != g:
                raise ConfigError(
                    f"rollbank group {group.group_id} has {group.size} slots but TRL's "
                    f"num_generations is {g}; set them equal", field="num_generations")
            if len(group.rows) == g:
                return group
            self.skipped.append(group.group_id)
        raise RolloutsExhaustedError(
            f"no further complete rollbank group ({len(self.served)} served, "
            f"{len(self.skipped)} skipped); lower max_steps or collect more batches")


def rollbank_reward(
    prompts: list[Any], completions: list[Any], **kwargs: Any
) -> list[float | None]:  # TRL's RewardFunc type (None: unscorable)
    """TRL reward function: the verifier reward rollbank recorded for each completion."""
    return [float(r) for r in kwargs["rollbank_reward"]]


def rollbank_advantage(
    prompts: list[Any], completions: list[Any], **kwargs: Any
) -> list[float | None]:
    """TRL reward function: rollbank's GRPO advantage (use alone, ``scale_rewards="none"``)."""
    return [float(a) for a in kwargs["rollbank_advantage"]]


def placeholder_dataset(rows: int) -> Any:
    """A TRL train dataset of ``rows`` placeholder prompts (rollbank picks the tasks)."""
    datasets = importlib.import_module("datasets")  # TRL's dependency (untyped)
    return datasets.Dataset.from_dict({"prompt": [f"rollbank rollout {i}" for i in range(rows)]})


__all__ = [
    "BatchStream", "RollbankRollouts", "RolloutGroup", "RolloutRow", "RolloutsExhaustedError",
    "groups_from_batch_dirs", "groups_from_batches", "groups_from_table", "placeholder_dataset",
    "rollbank_advantage", "rollbank_reward",
]
