"""Shared-memory tensor buffers: the data plane of the direct (separate-process) transport.

A :class:`ShmLayout` places named tensors at 64-byte aligned offsets of one flat buffer; the
trainer writes them into a file under ``/dev/shm`` (tmpfs: RAM, never storage) with one
``memcpy`` per tensor, and the vLLM worker maps the same file read-only
(``torch.from_file``) and loads views of it, with no copy in between. The layout travels as
plain JSON in the ``update_info`` of vLLM's ``/update_weights`` route.

Both ends must be on one host (``/dev/shm`` is not shared across machines).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALIGN = 64
SHM_DIR = Path("/dev/shm")

_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool")


def dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def torch_dtype(name: str) -> Any:
    import torch

    if name not in _DTYPES:
        raise ValueError(f"unsupported tensor dtype {name!r}")
    return getattr(torch, name)


@dataclass(frozen=True)
class ShmLayout:
    """Where each tensor lives in the flat buffer (all lists index-aligned)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    offsets: list[int]
    nbytes: int

    @classmethod
    def of(cls, tensors: Mapping[str, Any]) -> ShmLayout:
        names, dtypes, shapes, offsets = [], [], [], []
        pos = 0
        for name, t in tensors.items():
            pos = -(-pos // ALIGN) * ALIGN
            names.append(name)
            dtypes.append(dtype_name(t))
            shapes.append([int(s) for s in t.shape])
            offsets.append(pos)
            pos += int(t.numel()) * int(t.element_size())
        return cls(names, dtypes, shapes, offsets, max(pos, 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "dtype_names": self.dtype_names,
            "shapes": self.shapes,
            "offsets": self.offsets,
            "nbytes": self.nbytes,
        }


def map_file(path: Path, nbytes: int, *, writable: bool) -> Any:
    """A uint8 tensor over ``path`` (``MAP_SHARED`` when writable, private otherwise)."""
    import torch

    return torch.from_file(str(path), shared=writable, size=nbytes, dtype=torch.uint8)


def views(buf: Any, layout: ShmLayout) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` views into ``buf`` (no copy)."""
    import torch

    for name, dt, shape, off in zip(
        layout.names, layout.dtype_names, layout.shapes, layout.offsets, strict=True
    ):
        dtype = torch_dtype(dt)
        numel = 1
        for s in shape:
            numel *= s
        size = numel * torch.empty(0, dtype=dtype).element_size()
        yield name, buf[off : off + size].view(dtype).view(shape)


class ShmBuffer:
    """A trainer-side ``/dev/shm`` file holding one set of tensors; reused while the layout
    (names, dtypes, shapes) stays the same."""

    def __init__(self, tag: str, directory: Path = SHM_DIR) -> None:
        self.path = directory / f"rollbank-weights-{os.getpid()}-{tag}"
        self.layout: ShmLayout | None = None
        self._buf: Any = None

    def write(self, tensors: Mapping[str, Any]) -> ShmLayout:
        layout = ShmLayout.of(tensors)
        if self.layout is None or self.layout != layout:
            self.close()
            with self.path.open("wb") as f:
                # reserve the pages now: a full tmpfs raises ENOSPC here instead of SIGBUS on
                # the first write through the mapping
                os.posix_fallocate(f.fileno(), 0, layout.nbytes)
            self._buf = map_file(self.path, layout.nbytes, writable=True)
            self.layout = layout
        for (_, dst), t in zip(views(self._buf, layout), tensors.values(), strict=True):
            dst.copy_(t.detach().reshape(dst.shape))
        return layout

    def close(self) -> None:
        self._buf = None
        self.layout = None
        self.path.unlink(missing_ok=True)
