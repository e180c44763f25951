"""Integration: the chat harness on real vLLM serving SmolLM2-135M-Instruct (one server).

- every model token of a chat-harness trajectory is the engine's sampled id, with its log-prob
  and version, in order (the engine's answers are recorded by a pass-through client);
- re-tokenising the transcript is measured (printed) while the recorded ids are exactly the
  samples;
- the drift shown: agents behind the gateway (sampling at temperature 1.0 random strings and
  tool calls); their transcripts re-rendered by the template and re-tokenised give different
  ids (printed, asserted in at least one) while the gateway's recorded ids are the engine's;
- the trainer's fp32 recompute on the recorded sequences matches the engine's fp32 log-probs
  within the numerics bound (docs/numerics.md: fp32 vs fp32 agree to ~3e-5 nats).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from recording_client import Recording

from rollbank.chat.template import ChatTemplate
from rollbank.clock import FakeClock, MonotonicClock
from rollbank.episodes.attribution import VerifierVerdict
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import ChatConfig
from rollbank.episodes.harnesses.chat import ChatHarness
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import WarmSource, spec_for
from rollbank.episodes.trajectory import Trajectory
from rollbank.gateway.gateway import Gateway
from rollbank.gateway.records import SessionRecord
from rollbank.gateway.serve import running
from rollbank.gateway.tokens import ChatDecode
from rollbank.inference.config import ServerConfig
from rollbank.inference.models import ensure_model, load_tokenizer
from rollbank.inference.server import ManagedServers
from rollbank.routing.factory import make_router
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import Sandbox, SandboxSpec
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec
from rollbank.tasks.model import Task, TaskFormat

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

MODEL = "smollm2-135m-instruct"
EPISODES = 4


def make_task() -> Task:
    p = Path("/tmp/rollbank-test/hello")
    return Task(task_id="hello", path=p, format=TaskFormat.HARBOR, content_hash="hash-hello",
                instruction="Write hello to /app/out.txt.", dockerfile=None, context_dir=p,
                tests_dir=p / "tests", test_command="bash /tests/test.sh", solution=None,
                workdir="/app")


class FileVerifier:
    async def verify(self, sandbox: Sandbox, task: Task) -> VerifierVerdict:
        try:
            ok = (await sandbox.read_file("/app/out.txt")).strip() == b"hello"
        except FileNotFoundError:
            ok = False
        return VerifierVerdict(float(ok), {"reward": float(ok)}, passed=ok)


async def spec_of(task: Task) -> tuple[SandboxSpec, tuple[str, ...]]:
    return spec_for(task, None), ("layer",)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ManagedServers]:
    cfg = ServerConfig(model=MODEL, dtype="float32", compile="eager", kv_cache_gib=1,
                       max_model_len=4096, run_dir=tmp_path_factory.mktemp("vllm-chat"))
    async with ManagedServers(cfg) as ms:
        yield ms


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def episodes(servers: ManagedServers) -> tuple[list[Trajectory], list[Recording]]:
    tok = load_tokenizer(ensure_model(MODEL))
    harness = ChatHarness(ChatConfig(max_tokens=96, temperature=1.0), model=MODEL)
    out: list[Trajectory] = []
    recs: list[Recording] = []
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        for i in range(EPISODES):  # one recording client per episode: its answers in order
            rec = Recording(servers.clients[0])
            runner = EpisodeRunner(
                RunnerConfig(max_turns=4, max_model_len=4096), tasks={"hello": make_task()},
                source=WarmSource(pool, spec_of), verifier=FileVerifier(),
                harness=harness, tokenizer=tok, clients={rec.base_url: rec},
                router=make_router("round_robin", [rec.base_url], FakeClock()))
            key = AttemptKey(seq=i, slot=0, retry=0, group_id=f"g{i}")
            out.append(await runner.run(AttemptSpec(key=key, task_id="hello", seed=i, group_size=1,
                                                    launched_at=0.0)))
            recs.append(rec)
    return out, recs


async def test_every_model_token_is_the_engines_sampled_id(
        episodes: tuple[list[Trajectory], list[Recording]]) -> None:
    trajs, recs = episodes
    for traj, rec in zip(trajs, recs, strict=True):
        assert rec.results, traj.outcome
        model_ids = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        model_lp = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
        model_v = [v for v, m in zip(traj.policy_versions, traj.loss_mask, strict=True) if m]
        assert model_ids == [t for r in rec.results for t in r.token_ids]
        assert model_lp == pytest.approx([lp for r in rec.results for lp in r.logprobs], abs=1e-6)
        assert model_v == [v for r in rec.results for v in r.token_versions]
        # each request's prompt is exactly the recorded sequence before that turn's tokens
        assert traj.segment_starts == [0]
        assert traj.meta["chat"]["prefix_stable"] is True


async def test_recorded_ids_do_not_drift_and_retokenising_is_measured(
        episodes: tuple[list[Trajectory], list[Recording]]) -> None:
    """The transcript (recorded ids decoded, special tokens kept) re-tokenised in one piece:
    where it differs from the record is printed (drift a re-tokenising trainer would see);
    the record itself holds every sampled run untouched. Drift is not asserted: on a run of
    SmolLM2 here (4 trajectories, 932 model tokens) re-tokenising gave the same ids; the
    deterministic drift case is the trimming template in tests/unit/test_chat_session.py."""
    tok = load_tokenizer(ensure_model(MODEL))
    report = {}
    for traj, rec in zip(*episodes, strict=True):
        retok = tok.encode(tok.decode(traj.token_ids, skip_special_tokens=False))
        n = min(len(retok), len(traj.token_ids))
        first = next((i for i in range(n) if retok[i] != traj.token_ids[i]), n)
        report[traj.trajectory_id] = {"recorded": len(traj.token_ids), "retokenised": len(retok),
                                      "same": retok == traj.token_ids, "first_difference": first}
        for r in rec.results:  # every sampled run is in the record, untouched
            assert _contains(traj.token_ids, r.token_ids)
    print(report)


def _contains(seq: list[int], sub: list[int]) -> bool:
    k = len(sub)
    return any(seq[i:i + k] == sub for i in range(len(seq) - k + 1))


async def test_trainer_recompute_matches_engine_logprobs_on_chat_trajectories(
        episodes: tuple[list[Trajectory], list[Recording]]) -> None:
    import torch

    from rollbank.batching.loader import TensorBatch
    from rollbank.numerics.report import compare
    from rollbank.training.config import TrainerConfig
    from rollbank.training.trainer import Trainer

    trajs = episodes[0]
    b, t = len(trajs), max(len(x.token_ids) for x in trajs)
    ids = np.zeros((b, t), dtype=np.int64)
    mask = np.zeros((b, t), dtype=np.float32)
    engine = np.zeros((b, t), dtype=np.float64)
    for i, x in enumerate(trajs):
        n = len(x.token_ids)
        ids[i, :n], mask[i, :n], engine[i, :n] = x.token_ids, x.loss_mask, x.logprobs
    attn = (np.arange(t)[None, :] < np.array([len(x.token_ids) for x in trajs])[:, None]).astype(np.int64)
    tb = TensorBatch(
        input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(attn),
        loss_mask=torch.from_numpy(mask), old_logprobs=torch.zeros((b, t)),
        policy_versions=torch.full((b, t), -1, dtype=torch.int32), advantages=torch.zeros(b),
        rewards=torch.zeros(b), prompt_lens=torch.tensor([x.prompt_len for x in trajs]),
        group_index=torch.arange(b), trajectory_ids=tuple(x.trajectory_id for x in trajs))
    trainer = await asyncio.to_thread(Trainer.load, TrainerConfig(
        model=MODEL, finetune="full", dtype="float32", fp32_lm_head=True, micro_batch_size=2))
    mine = np.asarray((await asyncio.to_thread(trainer.logprobs, tb)).numpy(), dtype=np.float64)
    rep = compare(engine, mine, mask, ids)
    print({"tokens": int(mask.sum()), **{k: rep["abs"][k] for k in ("mean", "max")}})
    assert rep["abs"]["n"] == int(mask.sum()) > 0
    assert rep["abs"]["max"] < 1e-3 and rep["abs"]["mean"] < 1e-4
    # negative control: one position off disagrees badly
    bad = compare(engine, np.roll(mine, 1, axis=1), mask, ids)
    assert bad["abs"]["mean"] > 0.1


SHELL: Any = [{"type": "function", "function": {
    "name": "shell", "description": "run a shell command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]
DRIFT_PROMPTS = ("Make up a random password of 40 letters, digits and symbols.",
                 "Write a random base64 string of about 60 characters.",
                 "Use the shell tool to write hello to /app/out.txt.",
                 "Spell a long made-up word without spaces, then another.")


def _first_difference(a: list[int], b: list[int]) -> int | None:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), None if len(a) == len(b) else n)


async def test_rerendered_transcripts_drift_while_the_gateway_record_does_not(
        servers: ManagedServers) -> None:
    """Agents behind the gateway, each 3 turns at temperature 1.0, resending their history as
    the ``openai`` client returned it (content, structured tool calls, tool results). Their
    transcript re-rendered by the template and re-tokenised (what a trainer that keeps
    messages does) is compared with the ids the gateway recorded: the differences are printed
    and at least one must show (non-canonical sampled tokenisations of random strings,
    tool-call text the template writes back canonically); the gateway's own record holds the
    engine's ids and reuses them exactly each turn. A wave of 8 agents that shows no drift
    is followed by another (:data:`WAVES` at most)."""
    tok = load_tokenizer(ensure_model(MODEL))
    engine = Recording(servers.clients[0])
    clock = MonotonicClock()
    gw = Gateway({engine.base_url: engine}, make_router("cache_aware", [engine.base_url], clock),
                 ChatDecode(tok), ChatTemplate.for_model(MODEL), model=MODEL, clock=clock,
                 eos_token_id=tok.eos_token_id)
    assert gw.template is not None

    async def agent(i: int) -> tuple[list[Any], SessionRecord]:
        h = gw.open_session(f"drift-{i}", f"drift-{i}")
        msgs: list[Any] = [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": DRIFT_PROMPTS[i % len(DRIFT_PROMPTS)]}]
        async with AsyncOpenAI(base_url=h.base_url, api_key=h.api_key, max_retries=0) as c:
            for _ in range(3):
                r = await c.chat.completions.create(model=MODEL, messages=msgs, tools=SHELL,
                                                    max_tokens=48, temperature=1.0)
                m = r.choices[0].message.model_dump(exclude_none=True)
                msgs.append(m)
                msgs.append({"role": "tool", "tool_call_id": m["tool_calls"][0]["id"],
                             "content": "done"} if m.get("tool_calls") else
                            {"role": "user", "content": "Another one, different."})
        return msgs[:-2], await gw.close_session(h)  # the history its last request carried

    report: list[dict[str, Any]] = []
    async with running(gw):
        for wave in range(WAVES):  # 8 agents a wave; the next wave only while none drifted
            agents = await asyncio.gather(*(agent(wave * 8 + i) for i in range(8)))
            _check_wave(agents, engine, tok, gw.template, report)
            if any(r["rerendered_first_difference"] is not None for r in report):
                break
    print({"drift": report})
    assert any(r["rerendered_first_difference"] is not None for r in report), report


#: Waves of 8 agents at most: about 1 transcript in 4 drifts on SmolLM2 at temperature 1.0,
#: so 8 agents show none ~10% of the time, 24 agents ~0.1%.
WAVES = 3


def _check_wave(agents: list[tuple[list[Any], SessionRecord]], engine: Recording, tok: Any,
                template: ChatTemplate, report: list[dict[str, Any]]) -> None:
    by_id = {r.request_id: r for r in engine.results}
    for history, rec in agents:
        # the record: the engine's ids, reused exactly every turn, one segment
        for req in rec.requests:
            sampled = by_id[req.request_id]
            assert req.status == "ok" and req.output_token_ids == sampled.token_ids
            assert req.logprobs == sampled.logprobs and req.token_versions == sampled.token_versions
        for prev, nxt in zip(rec.requests, rec.requests[1:], strict=False):
            held = prev.prompt_token_ids + prev.output_token_ids
            assert nxt.prompt_token_ids[:len(held)] == held and nxt.reused_prompt_tokens == len(held)
        assert [r.segment for r in rec.requests] == [0, 0, 0]
        recorded = rec.requests[-1].prompt_token_ids
        rerendered = tok.encode(template.render(history, tools=SHELL, add_generation_prompt=True))
        retokenised = tok.encode(tok.decode(recorded, skip_special_tokens=False))
        at = _first_difference(rerendered, recorded)
        shown = None if at is None else {
            "recorded": [tok.decode([t], skip_special_tokens=False) for t in recorded[at:at + 4]],
            "rerendered": [tok.decode([t], skip_special_tokens=False) for t in rerendered[at:at + 4]]}
        report.append({"session": rec.attempt_id, "tokens": len(recorded),
                       "tool_calls": sum(bool(r.tool_calls) for r in rec.requests),
                       "rerendered_first_difference": at, "retokenised_first_difference":
                       _first_difference(retokenised, recorded), "at_difference": shown})
