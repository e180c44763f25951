"""The chat harness in the real episode runner, with scripted models on fake servers that
sample through a tokenizer with ChatML special tokens (model ids as a real engine's)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from chat_templates import CHATML, CHATML_SPECIALS, QWEN3_THINK
from episode_rig import FileVerifier, Recorder, Rig, fake_spec, make_task

from rollbank.chat.fake_tokenizer import SpecialTokenizer
from rollbank.chat.template import ChatTemplate
from rollbank.clock import FakeClock
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.harnesses import ChatConfig
from rollbank.episodes.harnesses.chat import ChatHarness
from rollbank.episodes.outcome import Outcome
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.fake import make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.routing.factory import make_router
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool

TOK = SpecialTokenizer(CHATML_SPECIALS, bos="<|im_start|>", eos="<|im_end|>")
WRITE = '<tool_call>{"name": "shell", "arguments": {"command": "echo hello > /app/out.txt"}}</tool_call>'
SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


def script(*turns: str) -> Callable[[GenerateRequest], str]:
    """Turn k (model turns after the real task began) says ``turns[k]``, then its stop token."""

    def respond(req: GenerateRequest) -> str:
        prompt = TOK.decode(list(req.prompt_token_ids), skip_special_tokens=False)
        k = prompt.split("Now the real task.")[-1].count("<|im_start|>assistant\n") - 1
        return turns[min(k, len(turns) - 1)] + "<|im_end|>"

    return respond


@contextlib.asynccontextmanager
async def chat_rig(responder: Callable[[GenerateRequest], str], template: str = CHATML,
                   **cfg: Any) -> AsyncIterator[Rig]:
    backend = FakeBackend(files={"/app/.keep": b""})
    fakes, clients = make_fake_fleet(1, responder=responder, tokenizer=TOK)
    harness = ChatHarness(ChatConfig(), template=ChatTemplate(template, name="t"))
    async with WarmPool(backend) as pool:
        recorded: list[Trajectory] = []
        verifier = FileVerifier()
        runner = EpisodeRunner(
            RunnerConfig(**{"max_turns": 6, "max_model_len": 4000, **cfg}), tasks={"hello": make_task()},
            source=WarmSource(pool, fake_spec(("layer-a",))), verifier=verifier,
            harness=harness, tokenizer=TOK, clients={c.base_url: c for c in clients},
            router=make_router("round_robin", [c.base_url for c in clients], FakeClock()),
            recorder=Recorder(recorded))
        yield Rig(runner, backend, fakes, verifier, recorded)


def _text(traj: Trajectory) -> str:
    return TOK.decode(traj.token_ids, skip_special_tokens=False)


async def test_well_formed_tool_calls_solve_the_task_token_exact() -> None:
    async with chat_rig(script(WRITE, SUBMIT)) as r:
        traj = await r.run()
    assert traj.outcome is not None and traj.outcome.outcome is Outcome.MODEL_SUCCESS
    chat = traj.meta["chat"]
    assert [t["well_formed"] for t in chat["turns"]] == [True, True]
    assert chat["prefix_stable"] is True and chat["tools_in"] == "system"
    text = _text(traj)
    assert '"name": "shell"' in text.split("<|im_start|>user")[0]  # schemas in the system turn
    assert "<|im_start|>tool\n[exit code 0]<|im_end|>\n<|im_start|>assistant\n" in text
    # the model's stop token once, then the template's newline: as a fresh render would give
    assert text.count("<|im_end|><|im_end|>") == 0
    model = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert TOK.decode(model, skip_special_tokens=False) == WRITE + "<|im_end|>" + SUBMIT + "<|im_end|>"
    assert traj.prompt_len == traj.loss_mask.index(1) and traj.segment_starts == [0]


async def test_a_fenced_bash_block_runs_leniently_and_is_recorded_as_not_well_formed() -> None:
    async with chat_rig(script("```bash\necho hello > /app/out.txt\n```", SUBMIT)) as r:
        traj = await r.run()
    assert traj.outcome is not None and traj.outcome.outcome is Outcome.MODEL_SUCCESS
    turns = traj.meta["chat"]["turns"]
    assert [t["well_formed"] for t in turns] == [False, True]
    assert "fenced shell block" in turns[0]["errors"][-1]


async def test_malformed_turns_are_model_turns_with_an_observation_never_a_crash() -> None:
    turns = ("I am not sure.", '<tool_call>{"name": "shell", "arguments": {"command": 1}}</tool_call>',
             '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "<tool_call>{oops</tool_call>",
             WRITE, SUBMIT)
    async with chat_rig(script(*turns)) as r:
        traj = await r.run()
    assert traj.outcome is not None and traj.outcome.outcome is Outcome.MODEL_SUCCESS
    obs = [s.observation for s in traj.steps]
    assert "no usable tool call" in obs[0] and 'needs a string argument "command"' in obs[1]
    assert "unknown tool 'rm_rf'" in obs[2] and "invalid JSON" in obs[3]
    text = _text(traj)
    # no call: a user message; a call with bad arguments: its tool result says why
    assert "<|im_start|>user\nYour reply had no usable tool call" in text
    assert "<|im_start|>tool\nError: unknown tool 'rm_rf'" in text
    assert [t["well_formed"] for t in traj.meta["chat"]["turns"]] == [False, True, True, False, True, True]


async def test_a_template_that_rewrites_history_records_segments_for_the_batch() -> None:
    think = "<think>write it</think>\n" + WRITE
    async with chat_rig(script("no idea", think, "<think>x</think>\nhmm", SUBMIT),
                        template=QWEN3_THINK) as r:
        traj = await r.run()
    chat = traj.meta["chat"]
    assert chat["prefix_stable"] is False
    assert traj.segment_starts[0] == 0 and len(traj.segment_starts) >= 2
    assert [s["reason"] for s in chat["segments"]][1] == "template_rewrites_history"
    for start in traj.segment_starts[1:]:  # each new segment opens with a prompt (mask 0)
        assert traj.loss_mask[start] == 0
    assert traj.outcome is not None and traj.outcome.outcome is Outcome.MODEL_SUCCESS
    assert json.dumps(chat)  # the record is plain data
