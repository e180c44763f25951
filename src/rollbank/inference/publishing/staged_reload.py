"""Reload new weights *beside* a serving model, then swap them in with a cheap step.

vLLM reloads checkpoint-format weights layer by layer: each layer is moved to the meta
device, re-materialised, loaded through the model's name mapping (``load_weights``: fused
q/k/v, gate/up, dtype conversion), re-processed (``process_weights_after_loading``: on CPU
the GEMM weight repack into a oneDNN / sgl handler held by a ``cpu_linear`` closure), and
its final values are copied back into the layer's original ("kernel") tensors. All of it
touches the live model, so it must run while generation is stopped — that was most of the
apply pause.

:class:`StagedReload` runs the same machinery on a *shadow* of the model while the engine
still generates: a copy of the module tree whose modules share everything with the live ones
except their own parameters and buffers (fresh clones, so the reload's copy-back lands in the
shadow, never in the live model). When the reload is done, the shadow holds the new kernel
tensors and the non-tensor attributes the processing (re)assigned (e.g. ``cpu_linear``).
:meth:`StagedReload.swap` — the only step that must be inside the pause — copies those tensors
in place into the live kernel tensors (references kept, as vLLM's own reload does) and
assigns the changed attributes (pointer swaps). The live model then is in the state a reload
in the pause would have left it in.

Cost: one extra copy of the parameters in the worker's memory (the shadow), kept between
updates. The reload function is a seam (``reload``); the default is vLLM's layerwise reload.
Every contact with vLLM's internals (the reload functions, ``LAYERWISE_INFO``, the parameter
classes a clone keeps) goes through :mod:`rollbank.inference.vllm_internals`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

# module attributes that are the module tree itself, never swapped as "changed attributes"
_STRUCTURE = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})

Reload = Callable[[Any, Iterable[tuple[str, Any]]], None]


def vllm_layerwise_reload(model_config: Any) -> Reload:
    """vLLM's checkpoint-format reload (what ``reload_weights(is_checkpoint_format=True)``
    does), applied to whichever model it is given."""

    def reload(model: Any, weights: Iterable[tuple[str, Any]]) -> None:
        from rollbank.inference.vllm_internals import layerwise_reload

        initialize, finalize = layerwise_reload()
        initialize(model)
        model.load_weights(weights)
        finalize(model, model_config)

    return reload


def _clone_tensor(t: Any, memo: dict[int, Any]) -> Any:
    """A tensor of the same class and attributes (``weight_loader`` etc.) with its own storage."""
    if id(t) not in memo:
        from rollbank.inference.vllm_internals import clone_parameter

        memo[id(t)] = clone_parameter(t)
    return memo[id(t)]


def shadow_of(model: Any, *, share_layerwise_info: bool = True) -> tuple[Any, list[tuple[Any, Any]]]:
    """The shadow module tree and its ``(live, shadow)`` module pairs. Shared submodules and
    tied tensors stay shared (one clone each). With ``share_layerwise_info``, each shadow
    module gets the live module's reload metadata (vLLM records it at load time, sanitised
    of layer references, so it can serve another module object)."""
    modules: dict[int, Any] = {}
    tensors: dict[int, Any] = {}
    pairs: list[tuple[Any, Any]] = []

    def clone(m: Any) -> Any:
        if id(m) in modules:
            return modules[id(m)]
        s = copy.copy(m)  # a new object with a shallow copy of m.__dict__
        modules[id(m)] = s
        pairs.append((m, s))
        d = s.__dict__  # written directly: nn.Module.__setattr__ would route tensors/modules
        d["_parameters"] = {k: None if p is None else _clone_tensor(p, tensors) for k, p in m._parameters.items()}
        d["_buffers"] = {k: None if b is None else _clone_tensor(b, tensors) for k, b in m._buffers.items()}
        d["_non_persistent_buffers_set"] = set(m._non_persistent_buffers_set)
        d["_modules"] = {k: None if c is None else clone(c) for k, c in m._modules.items()}
        return s

    root = clone(model)
    if share_layerwise_info:
        from rollbank.inference.vllm_internals import share_layerwise_info as share

        share(pairs)
    return root, pairs


@dataclass
class SwapPlan:
    """What :meth:`StagedReload.swap` does: in-place tensor copies and attribute swaps."""

    copies: list[tuple[Any, Any]] = field(default_factory=list)  # (live tensor, shadow tensor)
    attrs: list[tuple[Any, str, Any]] = field(default_factory=list)  # (live module, name, value)
    nbytes: int = 0


class StagedReload:
    """Stage new weights on a shadow of ``model`` (generation may go on), swap them in later."""

    def __init__(self, model: Any, reload: Reload, *, share_layerwise_info: bool = True) -> None:
        self.model = model
        self.reload = reload
        self._share = share_layerwise_info
        self._shadow: Any = None
        self._pairs: list[tuple[Any, Any]] = []
        self._plan: SwapPlan | None = None
        self.timings_ms: dict[str, float] = {}

    @property
    def staged(self) -> bool:
        return self._plan is not None

    def stage(self, weights: Iterable[tuple[str, Any]]) -> SwapPlan:
        """Reload ``weights`` into the shadow (built on first use). The live model is only
        read. A second stage before a swap replaces the first."""
        import torch

        t0 = time.perf_counter()
        self._plan = None
        if self._shadow is None:
            self._shadow, self._pairs = shadow_of(self.model, share_layerwise_info=self._share)
        else:  # the live model may have changed since (a swap, or a reload in the pause)
            self._sync()
        t1 = time.perf_counter()
        with torch.no_grad():
            self.reload(self._shadow, weights)
        t2 = time.perf_counter()
        plan = SwapPlan()
        for live, s in self._pairs:
            for kind in ("_parameters", "_buffers"):
                mine, theirs = getattr(live, kind), getattr(s, kind)
                for name, t in mine.items():
                    src = theirs.get(name)
                    if t is None or src is None:
                        continue
                    if tuple(t.shape) != tuple(src.shape) or t.dtype != src.dtype:
                        raise RuntimeError(f"staged reload changed {type(live).__name__}.{name}: "
                                           f"{tuple(t.shape)}/{t.dtype} -> {tuple(src.shape)}/{src.dtype}")
                    if t.numel() and not torch.equal(t, src):  # only what the reload changed
                        plan.copies.append((t, src))
                        plan.nbytes += int(t.numel()) * int(t.element_size())
            for name, value in s.__dict__.items():
                if name in _STRUCTURE:
                    continue
                if name not in live.__dict__ or live.__dict__[name] is not value:
                    plan.attrs.append((live, name, value))
        self._plan = plan
        self.timings_ms = {"shadow_ms": 1e3 * (t1 - t0), "reload_ms": 1e3 * (t2 - t1),
                           "plan_ms": 1e3 * (time.perf_counter() - t2)}
        return plan

    def _sync(self) -> None:
        """Make the shadow equal to the live model again: tensor values and the non-tensor
        attributes (so the next diff sees only what the next reload changes)."""
        import torch

        with torch.no_grad():
            for live, s in self._pairs:
                for kind in ("_parameters", "_buffers"):
                    theirs = getattr(s, kind)
                    for name, t in getattr(live, kind).items():
                        src = theirs.get(name)
                        if t is not None and src is not None and t.numel() and src.shape == t.shape:
                            src.copy_(t)
                d = s.__dict__
                for name in [k for k in d if k not in _STRUCTURE and k not in live.__dict__]:
                    del d[name]
                for name, value in live.__dict__.items():
                    if name not in _STRUCTURE:
                        d[name] = value

    def swap(self) -> SwapPlan:
        """Install the staged weights into the live model (call with generation stopped)."""
        import torch

        if self._plan is None:
            raise RuntimeError("nothing staged")
        plan, self._plan = self._plan, None
        t0 = time.perf_counter()
        with torch.no_grad():
            for dst, src in plan.copies:
                dst.copy_(src)
        t1 = time.perf_counter()
        for live, name, value in plan.attrs:
            live.__dict__[name] = value
        self.timings_ms.update(copy_ms=1e3 * (t1 - t0), attrs_ms=1e3 * (time.perf_counter() - t1))
        return plan

    def discard(self) -> None:
        """Forget a staged update (the shadow stays for the next one)."""
        self._plan = None
