"""StagedReload: an update prepared on a shadow of the model leaves the live model alone
until the swap, and the swap leaves it exactly as a reload of the live model would."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch

from rollbank.inference.publishing.staged_reload import StagedReload, shadow_of


class Packed(torch.nn.Module):
    """Like vLLM's CPU linear: the weight is repacked after loading into a closure."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n, n), requires_grad=False)
        self.scale = torch.nn.Parameter(torch.ones(n), requires_grad=False)
        self.repack()

    def repack(self) -> None:
        packed = (self.weight.detach() * self.scale.detach()).clone()
        def kernel(x: Any) -> Any:
            return x @ packed.t()

        self.kernel = kernel

    def forward(self, x: Any) -> Any:
        return self.kernel(x)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Packed(3)
        self.b = Packed(3)
        self.tied = self.a  # a shared submodule stays shared

    def forward(self, x: Any) -> Any:
        return self.b(self.a(x))


def fake_reload(model: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """Loads into the model's own tensors in place, then re-processes the layers it touched."""
    touched = set()
    for name, value in weights:
        mod_name, _, attr = name.rpartition(".")
        mod = model.get_submodule(mod_name)
        getattr(mod, attr).copy_(value)
        touched.add(mod_name)
    for mod_name in touched:
        model.get_submodule(mod_name).repack()


def test_stage_leaves_the_live_model_alone_and_swap_installs_the_reload() -> None:
    live = Net()
    x = torch.arange(3.0).reshape(1, 3)
    before = live(x).clone()
    weight_obj = live.a.weight
    staged = StagedReload(live, fake_reload, share_layerwise_info=False)
    new = 2 * torch.ones(3, 3)
    plan = staged.stage([("a.weight", new)])
    assert torch.equal(live(x), before) and torch.equal(live.a.weight, torch.ones(3, 3))
    assert len(plan.copies) == 1 and [(m, n) for m, n, _ in plan.attrs] == [(live.a, "kernel")]
    staged.swap()
    assert live.a.weight is weight_obj and torch.equal(live.a.weight, new)  # in place
    reference = Net()
    fake_reload(reference, [("a.weight", new)])
    assert torch.equal(live(x), reference(x)) and not torch.equal(live(x), before)
    with pytest.raises(RuntimeError):
        staged.swap()  # nothing staged any more


def test_a_partial_update_after_an_out_of_band_reload_keeps_the_other_layers() -> None:
    live = Net()
    staged = StagedReload(live, fake_reload, share_layerwise_info=False)
    staged.stage([("a.weight", 2 * torch.ones(3, 3))])
    staged.swap()
    fake_reload(live, [("b.scale", 5 * torch.ones(3))])  # e.g. a rollback reloaded in place
    staged.stage([("a.scale", 3 * torch.ones(3))])  # touches only layer a
    staged.swap()
    reference = Net()
    fake_reload(reference, [("a.weight", 2 * torch.ones(3, 3)), ("a.scale", 3 * torch.ones(3)),
                            ("b.scale", 5 * torch.ones(3))])
    x = torch.arange(3.0).reshape(1, 3)
    assert torch.equal(live(x), reference(x))
    assert torch.equal(live.b.scale, 5 * torch.ones(3))  # not reverted to the shadow's old value


def test_the_shadow_owns_its_tensors_and_keeps_sharing() -> None:
    live = Net()
    shadow, pairs = shadow_of(live, share_layerwise_info=False)
    assert shadow.tied is shadow.a and len(pairs) == 3
    assert shadow.a.weight is not live.a.weight and torch.equal(shadow.a.weight, live.a.weight)
    shadow.a.weight.mul_(0)
    assert torch.equal(live.a.weight, torch.ones(3, 3))
    assert isinstance(shadow.a.weight, torch.nn.Parameter)


def test_discard_forgets_the_staged_update() -> None:
    live = Net()
    staged = StagedReload(live, fake_reload, share_layerwise_info=False)
    staged.stage([("a.weight", 2 * torch.ones(3, 3))])
    assert staged.staged
    staged.discard()
    assert not staged.staged
    with pytest.raises(RuntimeError):
        staged.swap()
    assert torch.equal(live.a.weight, torch.ones(3, 3))
