"""The learning bench's task family: graded addition, answered by writing a file.

A task is ``a + b`` at one of three difficulty levels (level 1: both operands < 10; level 2:
one operand < 20; level 3: both < 50). The prompt asks for the action; the agent's action is a
shell command that writes the answer to ``answer.txt``::

    Q: 13+7=? A: echo 20 > answer.txt

The verifier is :func:`verify`: it accepts exactly one ``echo N > answer.txt`` command (what a
sandbox would execute) and passes when the file would hold ``a + b``. Reward is 1 or 0. The
whole family is pure and seeded (no I/O): the same ``(seed, step)`` gives the same prompts in
every arm of the experiment.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

LEVEL_BOUNDS: dict[int, tuple[int, int]] = {1: (10, 10), 2: (20, 10), 3: (50, 50)}
_ACTION = re.compile(r"\s*echo (-?\d{1,6}) > answer\.txt\s*")


@dataclass(frozen=True)
class AdditionTask:
    """One task: its operands and difficulty level."""

    a: int
    b: int
    level: int

    @property
    def task_id(self) -> str:
        return f"add/L{self.level}/{self.a}+{self.b}"

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def prompt(self) -> str:
        return f"Q: {self.a}+{self.b}=? A:"

    @property
    def action(self) -> str:
        """The correct action (used by the supervised warm-up only)."""
        return f" echo {self.answer} > answer.txt\n"


def parse_action(completion: str) -> int | None:
    """The integer an ``echo N > answer.txt`` completion writes; None for any other text."""
    m = _ACTION.fullmatch(completion)
    return int(m.group(1)) if m else None


def verify(task: AdditionTask, completion: str) -> float:
    """1.0 when the completion writes the right answer to answer.txt, else 0.0."""
    return 1.0 if parse_action(completion) == task.answer else 0.0


def sample_task(rng: random.Random, levels: tuple[int, ...] = (1, 2, 3)) -> AdditionTask:
    """A task at a uniformly chosen level (operands uniform within the level's bounds)."""
    level = rng.choice(levels)
    hi_a, hi_b = LEVEL_BOUNDS[level]
    a, b = rng.randrange(hi_a), rng.randrange(hi_b)
    if rng.random() < 0.5:
        a, b = b, a
    return AdditionTask(a, b, level)


def step_tasks(seed: int, step: int, n: int, levels: tuple[int, ...] = (1, 2, 3)) -> list[AdditionTask]:
    """The ``n`` prompts of training step ``step`` (identical across arms for one seed)."""
    rng = random.Random(f"learning/{seed}/{step}")
    return [sample_task(rng, levels) for _ in range(n)]


def eval_tasks(n: int, levels: tuple[int, ...] = (1, 2, 3)) -> list[AdditionTask]:
    """A fixed evaluation set (its own seed stream, independent of every training seed)."""
    rng = random.Random("learning/eval")
    return [sample_task(rng, levels) for _ in range(n)]
