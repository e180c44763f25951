"""`rollbank collect --harness agent` wired end to end against fakes: the collector serves the
gateway over its router and fake clients, mini-swe-agent (unchanged) runs each attempt against
a scripted engine, and the batches hold the gateway's tokens."""

from __future__ import annotations

from pathlib import Path

from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.batching.writer import ready_batches
from rollbank.collect_config import load_collect_config
from rollbank.collector import collect
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference_plane import InferencePlane
from rollbank.metrics.events import read_events
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool

TOK = FakeTokenizer()
SOLVE = "THOUGHT: write it.\n\n```mswea_bash_command\necho hello > /app/out.txt\n```"
SUBMIT = "```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


def model(req: GenerateRequest) -> str:
    """A scripted engine answering in mini-swe-agent's format: solve, then submit."""
    return SUBMIT if "<returncode>" in TOK.decode(list(req.prompt_token_ids)) else SOLVE


async def test_collect_with_an_agent_harness_writes_the_gateways_tokens(tmp_path: Path) -> None:
    _, clients = make_fake_fleet(2, responder=model)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    cfg = load_collect_config(None, {
        "harness": "agent", "inference.kind": "fake", "inference.calibrate": False,
        "metrics.live": "off", "metrics.report": False, "task_order_seed": None,
        "scheduler.groups_per_batch": 1, "scheduler.pool_groups": 1,
        "scheduler.bank.group_size": 2, "scheduler.num_batches": 1,
        "scheduler.bank.dynamic_sampling.enabled": False,
    })
    backend = FakeBackend(files={"/app/.keep": b""})
    async with WarmPool(backend) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        result = await collect(cfg, tasks=[make_task()], inference=plane, sandboxes=sandboxes,
                               out_dir=tmp_path / "run")
    (batch,) = result.batches
    assert batch.outcomes == {"model_success": 2}
    # the summary's tok/s counts the gateway's generations (it printed 0.0 tok/s before)
    assert batch.model_tokens == sum(t.num_model_tokens for t in result.trajectories) > 0
    assert batch.tokens_per_s > 0
    assert len(ready_batches(tmp_path / "run" / "batches")) == 1
    for t in result.trajectories:
        assert t.meta["harness"] == "agent" and t.reward == 1.0
        assert t.num_model_tokens == sum(t.meta["gateway"]["output_tokens"]) > 0
        assert {v for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m} == {0}
    kinds = [e["kind"] for e in read_events(tmp_path / "run" / "events.jsonl")]
    assert "collector.gateway" in kinds
