"""The built-in trainer behind the loop's StepTrainer seam (tiny model): the tensors handed to a
tensor publisher are a detached copy named like the saved checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from safetensors.torch import load_file

from rollbank.training.config import TrainerConfig
from rollbank.training.loop_run import BuiltinTrainer


def test_tensors_are_a_copy_named_like_the_checkpoint(tmp_path: Path) -> None:
    trainer = BuiltinTrainer(TrainerConfig(model="tiny", finetune="full"))
    copy = trainer.tensors()
    saved = load_file(str(trainer.save(tmp_path, 1) / "model.safetensors"))
    assert set(saved) <= set(copy)  # tied weights may be saved once
    for name, tensor in saved.items():
        assert torch.equal(copy[name], tensor)
    name = next(iter(saved))
    with torch.no_grad():
        dict(trainer.trainer.model.named_parameters())[name].add_(1.0)
    assert torch.equal(copy[name], saved[name])  # training on does not touch the copy
