"""Token-exact multi-turn conversations, recorded into a :class:`Trajectory`.

A conversation is one growing token sequence. Turn ``k``'s prompt is turn ``k-1``'s prompt,
plus the token ids the model generated (exactly as the server returned them), plus the token
ids of the environment's observation. Nothing already in the sequence is ever re-tokenised, so
every prompt is an exact extension of the previous one: the server's prefix cache can serve
all of it, and the trainer sees exactly the tokens the policy was conditioned on.

Invariants
- The sequence only grows (``prompt_token_ids`` of turn ``k`` starts with that of turn ``k-1``).
- Model tokens carry mask 1, their behaviour log-prob and the policy version that sampled
  them; prompt and observation tokens carry mask 0, log-prob 0.0 and version -1
  (:data:`~rollbank.episodes.trajectory.ENV_VERSION`).
- BOS appears once, at position 0 (added to the initial prompt if the tokenizer did not, and
  stripped from the front of every observation if the tokenizer adds it there).

Token-exactness has one deliberate consequence: an observation is tokenised on its own, so
the ids at the seam between model text and observation text may differ from what tokenising
the concatenated text would give. That is intended. The model is trained on, and next turn
conditioned on, the very ids recorded here; re-tokenising the whole text each turn would
silently change earlier tokens (drift) and defeat the prefix cache.

Seam merge: servers stop generation *after* the token that completes a stop string and
return that token (vLLM keeps it in ``token_ids`` while cutting it from ``text``). A harness
whose observation begins with the same framing the model was stopped on (``"\\nOutput:"``)
would then repeat it. :meth:`Conversation.append_observation` drops the longest prefix of the
observation text (up to ``max_seam_chars``) that the decoded model turn already ends with, and
tokenises the rest. Only the not-yet-present characters are added; nothing is re-tokenised.
The same holds for a special token the model ended on (an end-of-turn id, which decodes to no
text): if the observation's ids start with that very id, it is not appended a second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.protocol import GenerateResult, Tokenizer
from rollbank.tasks.model import Task


class PromptSource(Protocol):
    """What :func:`open_conversation` needs of a harness."""

    def initial_prompt(self, task: Task) -> str: ...


def open_conversation(harness: PromptSource, tokenizer: Tokenizer, trajectory: Trajectory,
                      task: Task) -> Conversation:
    """An episode's started conversation: the harness's own (``open_conversation``: the chat
    harness, rendered by the model's chat template) or a text one from ``initial_prompt``."""
    opener: Any = getattr(harness, "open_conversation", None)
    if opener is not None:
        conv = opener(tokenizer, trajectory, task)
        if not isinstance(conv, Conversation):
            raise TypeError(f"{type(harness).__name__}.open_conversation returned {type(conv).__name__}")
        return conv
    conv = Conversation(tokenizer, trajectory)
    conv.start(harness.initial_prompt(task))
    return conv


class Conversation:
    """Builds the prompts of one episode and records every token into its trajectory."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        trajectory: Trajectory,
        *,
        add_bos: bool = True,
        max_seam_chars: int = 64,
    ) -> None:
        if trajectory.token_ids:
            raise ValueError("a Conversation starts from an empty trajectory")
        self.tokenizer = tokenizer
        self.trajectory = trajectory
        self.add_bos = add_bos
        self.max_seam_chars = max_seam_chars
        self._last_model_tail = ""  # decoded end of the most recent model turn
        self._last_model_id: int | None = None  # its last token, if it decodes to no text
        self._turns = 0
        self._started = False

    # ------------------------------------------------------------------ reading
    @property
    def prompt_token_ids(self) -> list[int]:
        """The next request's prompt: the whole sequence so far (a copy)."""
        return list(self.trajectory.token_ids)

    def __len__(self) -> int:
        return len(self.trajectory.token_ids)

    @property
    def model_turns(self) -> int:
        return self._turns

    def fits(self, max_context: int, max_new_tokens: int) -> bool:
        """Whether another turn of ``max_new_tokens`` fits in a ``max_context`` window."""
        return len(self) + max_new_tokens <= max_context

    # ------------------------------------------------------------------ writing
    def start(self, prompt_text: str) -> list[int]:
        """Tokenise the initial prompt (BOS once) and record it as the trajectory's prompt."""
        if self._started:
            raise RuntimeError("conversation already started")
        ids = self.tokenizer.encode(prompt_text)
        bos = self.tokenizer.bos_token_id
        if self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        self.trajectory.append_prompt(ids)
        self.trajectory.prompt_len = len(ids)
        self._started = True
        return ids

    def append_model(
        self, token_ids: Sequence[int], logprobs: Sequence[float], policy_version: int | Sequence[int]
    ) -> None:
        """Record one model turn exactly as generated (stop-string tokens included)."""
        self._require_started()
        ids = list(token_ids)
        self.trajectory.append_model(ids, list(logprobs), policy_version)
        self._turns += 1
        tail_ids = ids[-self.max_seam_chars :] if self.max_seam_chars else []
        self._last_model_tail = self.tokenizer.decode(tail_ids) if tail_ids else ""
        last = ids[-1] if ids else None
        self._last_model_id = last if last is not None and not self.tokenizer.decode([last]) else None

    def append_result(self, result: GenerateResult) -> None:
        """Record a server's answer (tokens, behaviour log-probs, weight version)."""
        self.append_model(result.token_ids, result.logprobs, result.token_versions)

    def append_observation(self, text: str) -> list[int]:
        """Tokenise environment text on its own (see the module docstring) and append it."""
        self._require_started()
        text = text[self._seam_overlap(text) :]
        last_special, self._last_model_id = self._last_model_id, None
        self._last_model_tail = ""
        if not text:
            return []
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids and ids[0] == bos:
            ids = ids[1:]
        if last_special is not None and ids and ids[0] == last_special:
            ids = ids[1:]
        self.trajectory.append_prompt(ids)
        return ids

    # ------------------------------------------------------------------ internals
    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("call start() with the initial prompt first")

    def _seam_overlap(self, text: str) -> int:
        """Length of the longest prefix of ``text`` the last model turn already ends with."""
        tail = self._last_model_tail
        for n in range(min(len(tail), len(text), self.max_seam_chars), 0, -1):
            if tail.endswith(text[:n]):
                return n
        return 0
