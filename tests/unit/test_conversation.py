"""Token-exact conversations against the fake inference server and small test tokenizers."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rollbank.episodes.conversation import Conversation
from rollbank.episodes.trajectory import ENV_VERSION, Trajectory
from rollbank.inference.fake import FakeInferenceServer, FakeTokenizer
from rollbank.inference.protocol import GenerateRequest, SamplingParams


def traj() -> Trajectory:
    return Trajectory(trajectory_id="t", group_id="g", task_id="task", attempt=0)


class PairTokenizer:
    """Greedy tokenizer that merges "ab" into one id (300) and knows one special id (301 =
    "<eot>", decoded to nothing), so seams and specials behave like a real BPE vocabulary."""

    AB, EOT, BOS = 300, 301, 302

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            if text.startswith("<eot>", i):
                out.append(self.EOT)
                i += 5
            elif text.startswith("ab", i):
                out.append(self.AB)
                i += 2
            else:
                out.append(ord(text[i]))
                i += 1
        return out

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(
            "ab" if t == self.AB else "" if t in (self.EOT, self.BOS) else chr(t) for t in token_ids
        )

    @property
    def bos_token_id(self) -> int | None:
        return self.BOS

    @property
    def eos_token_id(self) -> int | None:
        return self.EOT


class BosAddingTokenizer(FakeTokenizer):
    """Like FakeTokenizer, but encode() prepends BOS (as many HF tokenizers do by default)."""

    def encode(self, text: str) -> list[int]:
        return [self.BOS, *super().encode(text)]


def check_invariants(t: Trajectory) -> None:
    n = len(t.token_ids)
    assert len(t.logprobs) == len(t.loss_mask) == len(t.policy_versions) == n
    for m, lp, v in zip(t.loss_mask, t.logprobs, t.policy_versions, strict=True):
        if m == 0:
            assert lp == 0.0
            assert v == ENV_VERSION
        else:
            assert v != ENV_VERSION


async def test_every_prompt_extends_the_last_and_versions_follow_the_server() -> None:
    tok = FakeTokenizer()
    server = FakeInferenceServer(tokenizer=tok)
    conv = Conversation(tok, traj())
    first = conv.start("Task: list files\n")
    assert first[0] == tok.BOS
    assert conv.trajectory.prompt_len == len(first)
    prompts: list[list[int]] = []
    sp = SamplingParams(max_tokens=12, temperature=1.0)
    for turn in range(4):
        if turn == 2:
            server.reload_weights("/ckpt/step-1", version=1)
        prompt = conv.prompt_token_ids
        if prompts:
            assert prompt[: len(prompts[-1])] == prompts[-1]
            assert len(prompt) > len(prompts[-1])
        prompts.append(prompt)
        res = await server.generate(GenerateRequest(f"r{turn}", prompt, sp))
        conv.append_result(res)
        assert conv.trajectory.token_ids[len(prompt) :] == res.token_ids
        conv.append_observation(f"obs {turn}: ok\n")
    t = conv.trajectory
    check_invariants(t)
    assert t.token_ids.count(tok.BOS) == 1
    assert conv.model_turns == 4
    versions = sorted({v for v in t.policy_versions if v != ENV_VERSION})
    assert versions == [0, 1]
    assert t.num_model_tokens == 4 * 12


async def test_stop_string_tokens_kept_and_framing_not_repeated() -> None:
    tok = FakeTokenizer()
    server = FakeInferenceServer(
        tokenizer=tok, responder=lambda r: "```bash\nls\n```\nOutput:\n```\nbogus"
    )
    conv = Conversation(tok, traj())
    conv.start("Task: x\n")
    sp = SamplingParams(max_tokens=64, temperature=0.0, stop=("\nOutput:",))
    res = await server.generate(GenerateRequest("r0", conv.prompt_token_ids, sp))
    assert res.text == "```bash\nls\n```"
    assert tok.decode(res.token_ids).endswith("\nOutput:")
    conv.append_result(res)
    added = conv.append_observation("\nOutput:\n```\nfile.txt\n[exit code 0]\n```\n")
    assert tok.decode(added) == "\n```\nfile.txt\n[exit code 0]\n```\n"
    assert tok.decode(conv.trajectory.token_ids) == (
        "Task: x\n```bash\nls\n```\nOutput:\n```\nfile.txt\n[exit code 0]\n```\n"
    )


def test_observation_is_tokenised_on_its_own() -> None:
    tok = PairTokenizer()
    conv = Conversation(tok, traj())
    conv.start("go\n")
    conv.append_model(tok.encode("xa"), [-0.5, -0.25], policy_version=3)
    conv.append_observation("bc")
    ids = conv.trajectory.token_ids
    # "xa" + "bc" re-tokenised as one text would merge "ab"; the conversation must not
    assert ids == [tok.BOS, *tok.encode("go\n"), ord("x"), ord("a"), ord("b"), ord("c")]
    assert ids != [tok.BOS, *tok.encode("go\nxabc")]
    assert conv.trajectory.logprobs[-4:] == [-0.5, -0.25, 0.0, 0.0]
    assert conv.trajectory.loss_mask[-4:] == [1, 1, 0, 0]
    assert conv.trajectory.policy_versions[-4:] == [3, 3, ENV_VERSION, ENV_VERSION]


def test_special_end_of_turn_token_not_repeated_by_observation() -> None:
    tok = PairTokenizer()
    conv = Conversation(tok, traj())
    conv.start("q")
    conv.append_model([ord("{"), ord("}"), tok.EOT], [-1.0, -1.0, -0.1], policy_version=0)
    added = conv.append_observation("<eot>\nuser: out\n")
    assert added[0] == ord("\n")
    assert conv.trajectory.token_ids.count(tok.EOT) == 1
    # but an observation that does not start with it keeps everything
    conv.append_model([ord("x"), tok.EOT], [-1.0, -1.0], policy_version=0)
    assert conv.append_observation("more") == tok.encode("more")


def test_bos_once_whatever_the_tokenizer_does() -> None:
    tok = BosAddingTokenizer()
    conv = Conversation(tok, traj())
    ids = conv.start("hi")
    assert ids == [tok.BOS, *b"hi"]
    assert conv.append_observation("there") == list(b"there")
    assert conv.trajectory.token_ids.count(tok.BOS) == 1
    no_bos = Conversation(FakeTokenizer(), traj(), add_bos=False)
    assert no_bos.start("hi") == list(b"hi")


def test_misuse_is_rejected() -> None:
    tok = FakeTokenizer()
    conv = Conversation(tok, traj())
    with pytest.raises(RuntimeError):
        conv.append_observation("x")
    conv.start("a")
    with pytest.raises(RuntimeError):
        conv.start("b")
    with pytest.raises(ValueError):
        conv.append_model([1, 2], [0.0], policy_version=0)
    used = traj()
    used.append_prompt([1])
    with pytest.raises(ValueError):
        Conversation(tok, used)


def test_fits_reports_context_room() -> None:
    conv = Conversation(FakeTokenizer(), traj())
    conv.start("x" * 99)  # 100 tokens with BOS
    assert conv.fits(200, 100)
    assert not conv.fits(200, 101)
