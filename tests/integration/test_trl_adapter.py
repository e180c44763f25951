"""A real TRL GRPOTrainer step on the tiny model, its rollouts collected by rollbank.

The collection is rollbank's own (``collector.collect``: scheduler, ready bank, episode
runner, verifier, Parquet writer) on fake inference servers and fake sandboxes; one attempt's
second model turn hits a dead engine, an infra failure the ready bank re-runs in its slot. TRL
reads the batch directory through :class:`RollbankRollouts`. Token ids come from the fake
servers' byte tokenizer (all < 258, inside the tiny model's vocabulary), so the decoded text
TRL logs is meaningless; the ids, masks, log-probs, rewards and groups are rollbank's. Both reward functions are
trained once: the verifier reward (TRL centres it per group) and rollbank's advantage verbatim.
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer, RewardFunc

from rollbank.batching.loader import read_batch_dir
from rollbank.batching.writer import ready_batches
from rollbank.collect_config import load_collect_config
from rollbank.collector import CollectResult, collect
from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.sandboxes import SpecOf, WarmSource, spec_for
from rollbank.episodes.sources import SandboxPlane
from rollbank.errors import EngineDeadError
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.models import OFFLINE_ENV, ensure_model
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference_plane import InferencePlane
from rollbank.metrics.bound import Capacity
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import Sandbox, SandboxSpec
from rollbank.tasks.model import Task, TaskFormat
from rollbank.training.trl_adapter import (
    RollbankRollouts,
    groups_from_batch_dirs,
    placeholder_dataset,
    rollbank_advantage,
    rollbank_reward,
)

pytestmark = pytest.mark.integration

GROUP = 2  # rollbank group_size == TRL num_generations
GROUPS = 2
TOK = FakeTokenizer()


def _task(tid: str) -> Task:
    p = Path(f"/tmp/rollbank-test/{tid}")
    return Task(task_id=tid, path=p, format=TaskFormat.HARBOR, content_hash=f"hash-{tid}",
                instruction="Write hello to /app/out.txt.", dockerfile=None, context_dir=p,
                tests_dir=p / "tests", test_command="bash /tests/test.sh", solution=None,
                workdir="/app")


FAILING = "g00000/s0/r0"  # first run of group 0's slot 0: infra failure at its second turn


def _model(req: GenerateRequest) -> str:
    """Even slots write the file, odd slots give up: every group has reward variance."""
    prompt = TOK.decode(list(req.prompt_token_ids))
    slot = int(req.request_id.split("/s")[1].split("/")[0])
    if "\nOutput:" in prompt.split("Task: Write hello")[-1]:
        if req.request_id.startswith(FAILING + "/"):
            raise EngineDeadError("engine died", server="fake", request_id=req.request_id)
        return "DONE\n"
    return "```bash\necho hello > out.txt\n```\n" if slot % 2 == 0 else "DONE\n"


class _FileVerifier:
    """Passes (reward 1) when /app/out.txt holds "hello", else reward 0."""

    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        try:
            ok = (await sandbox.read_file("/app/out.txt")).strip() == b"hello"
        except FileNotFoundError:
            ok = False
        return VerifierVerdict(1.0 if ok else 0.0, {"reward": 1.0 if ok else 0.0}, passed=ok)


async def _spec_of(task: Task) -> tuple[SandboxSpec, tuple[str, ...]]:
    return spec_for(task, None), ("layer",)


async def _collect(out: Path) -> CollectResult:
    cfg = load_collect_config(None, {
        "inference.calibrate": False, "metrics.live": "off", "task_order_seed": None,
        "scheduler.groups_per_batch": GROUPS, "scheduler.pool_groups": GROUPS,
        "scheduler.bank.group_size": GROUP, "scheduler.bank.max_retries": 2,
        "scheduler.num_batches": 1,
        "scheduler.sandbox_slots": 4, "scheduler.inference_slots_per_server": 2,
    })
    _, clients = make_fake_fleet(1, responder=_model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    spec_of: SpecOf = _spec_of
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, spec_of), _FileVerifier())
        return await collect(cfg, tasks=[_task("t0"), _task("t1")], inference=plane,
                             sandboxes=sandboxes, out_dir=out,
                             capacity=Capacity(100.0, 400.0, 1000.0, 4000.0, sandbox_slots=4))


class _Recording(GRPOTrainer):
    """Keeps the scored batch TRL built from the rollouts (before TRL shuffles it)."""

    scored: list[dict[str, Any]]

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        out = super()._generate_and_score_completions(inputs)
        self.scored = [*getattr(self, "scored", []), out]
        return out


@dataclass(frozen=True)
class _Collected:
    batches: Path
    rows: dict[str, dict[str, Any]]  # trajectory_id -> schema-v1 row
    infra: set[str]  # attempts that ended as infra failures


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> _Collected:
    out = tmp_path_factory.mktemp("trl") / "run"
    result = asyncio.run(_collect(out))
    infra = {t.trajectory_id for t in result.trajectories
             if t.outcome is not None and not t.outcome.outcome.trainable}
    (batch,) = ready_batches(out / "batches")
    rows = {r["trajectory_id"]: r for r in read_batch_dir(batch).to_pylist()}
    return _Collected(out / "batches", rows, infra)


@pytest.mark.parametrize("reward_func", [rollbank_reward, rollbank_advantage])
def test_trl_grpo_step_trains_on_rollbank_groups(
    collected: _Collected, reward_func: RewardFunc, tmp_path: Path
) -> None:
    rows = collected.rows
    assert collected.infra == {FAILING}, "the dead engine must have made one infra attempt"

    os.environ.update(OFFLINE_ENV)
    torch.manual_seed(0)
    path = str(ensure_model("tiny"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    rollouts = RollbankRollouts(groups_from_batch_dirs(collected.batches))
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), num_generations=GROUP,
        per_device_train_batch_size=GROUP * GROUPS, gradient_accumulation_steps=1,
        max_steps=1, learning_rate=1e-3, beta=0.0, scale_rewards="none", use_cpu=True,
        report_to=[], save_strategy="no", logging_steps=1, seed=0, dataloader_num_workers=0,
    )
    trainer = _Recording(model=model, reward_funcs=[reward_func], args=args,
                         train_dataset=placeholder_dataset(GROUP * GROUPS),
                         processing_class=tokenizer, rollout_func=rollouts)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = trainer.train()

    # TRL's step ran: a finite loss, and the optimizer moved the weights
    assert trainer.state.global_step == 1 and math.isfinite(out.training_loss)
    assert any(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())

    # TRL saw rollbank's groups, whole and in order, and nothing infra-failed
    served = [r for g in rollouts.served for r in g.rows]
    assert len(rollouts.served) == GROUPS and rollouts.skipped == []
    ids = [r.trajectory_id for r in served]
    assert sorted(ids) == sorted(rows) and not set(ids) & collected.infra
    for g in rollouts.served:
        assert {rows[r.trajectory_id]["group_id"] for r in g.rows} == {g.group_id}

    (scored,) = trainer.scored
    for i, tid in enumerate(ids):
        row = rows[tid]
        p, n = row["prompt_len"], row["num_tokens"]
        mask = scored["completion_mask"][i].bool()
        assert scored["completion_ids"][i][mask].tolist() == row["token_ids"][p:n]
        assert scored["tool_mask"][i][mask].tolist() == row["loss_mask"][p:n]
        assert torch.allclose(scored["sampling_per_token_logps"][i][mask],
                              torch.tensor(row["logprobs"][p:n]))
        siblings = [rows[t]["reward"] for t in ids if rows[t]["group_id"] == row["group_id"]]
        if reward_func is rollbank_reward:  # TRL: r - mean(r) over the same group
            expected = row["reward"] - sum(siblings) / len(siblings)
        else:  # rollbank's own advantage (population std; here +-0.999998) passes through
            expected = row["advantage"]
            assert abs(expected) > 0.99
        assert float(scored["advantages"][i]) == pytest.approx(expected, abs=1e-6)
    assert sorted(rows[t]["reward"] for t in ids) == [0.0, 0.0, 1.0, 1.0]
    if reward_func is rollbank_reward:
        logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        assert logged == [pytest.approx(0.5)]
