"""The service's LoRA versions: the adapter loads on every engine, and inside the pause each
engine's version label moves and its client's requests switch to the adapter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_publishing import FakeEngine

from rollbank.errors import ConfigError
from rollbank.inference.fake import FakeTokenizer
from rollbank.inference.publishing import CheckpointPublisher
from rollbank.inference.publishing.protocol import WeightUpdate
from rollbank.inference_plane import InferencePlane
from rollbank.service.config import load_service_config
from rollbank.service.run import lora_publisher


class NamingEngine(FakeEngine):
    """A fake engine whose client names the model its requests go to."""

    model: str | None = None


def _adapter(root: Path) -> Path:
    from safetensors.torch import save_file

    root.mkdir()
    (root / "adapter_config.json").write_text('{"r": 4}')
    save_file({"x.lora_A.weight": torch.zeros(4, 3)}, str(root / "adapter_model.safetensors"))
    return root


def _plane(engines: list[FakeEngine]) -> InferencePlane:
    tok = FakeTokenizer()
    return InferencePlane({e.base_url: e for e in engines}, tok, tok.vocab_size, "fake")  # type: ignore[misc]


async def test_an_announced_adapter_is_loaded_labelled_and_routed(tmp_path: Path) -> None:
    log: list[str] = []
    engines: list[FakeEngine] = [NamingEngine("a", log), NamingEngine("b", log)]
    plane = _plane(engines)
    publisher = CheckpointPublisher(list(plane.clients.values()), None)  # type: ignore[arg-type]
    config = load_service_config(None, {"inference.kind": "fake"})
    get = lora_publisher(plane, publisher, config)
    pub = get()
    assert get() is pub  # made once
    rec = await pub.publish(WeightUpdate(path=str(_adapter(tmp_path / "v1")), lora=True), version=1)
    assert rec.ok and [e.version for e in engines] == [1, 1]
    assert [e.loras for e in engines] == [{"policy-v1": str(tmp_path / "v1")}] * 2
    assert [getattr(e, "model", None) for e in engines] == ["policy-v1"] * 2
    assert all(e.gate is publisher.fleet.gate for e in engines)  # one admission gate for both kinds


async def test_clients_that_cannot_name_an_adapter_are_refused() -> None:
    plane = _plane([FakeEngine("a", [])])
    publisher = CheckpointPublisher(list(plane.clients.values()), None)  # type: ignore[arg-type]
    config = load_service_config(None, {"inference.kind": "fake"})
    with pytest.raises(ConfigError, match="FakeEngine"):
        lora_publisher(plane, publisher, config)()
