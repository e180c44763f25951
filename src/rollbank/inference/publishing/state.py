"""What the engines serve, on the trainer side: validation and compact diffs.

:class:`ServedWeights` holds the model's tensor names/shapes (from the checkpoint's
safetensors headers) and, for the in-memory patterns, a CPU copy of the tensors every engine
currently serves — the base of the changed-tensor diff and of a rollback.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rollbank.errors import WeightMismatchError

# Checkpoint tensors that vLLM fuses into one parameter: a changed member means the whole
# fused parameter must be sent (a layerwise reload of a partly-loaded parameter is invalid).
FUSED_SIBLINGS: tuple[tuple[str, ...], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
)

_SAFETENSORS_DTYPES = {
    "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
    "I64": "int64", "I32": "int32", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip


def read_safetensors_meta(directory: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every tensor in ``directory/*.safetensors`` (headers only)."""
    meta: dict[str, tuple[tuple[int, ...], str]] = {}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            meta[name] = (tuple(info["shape"]), _SAFETENSORS_DTYPES.get(info["dtype"], info["dtype"]))
    return meta


def validate(
    names_shapes: Iterable[tuple[str, tuple[int, ...]]],
    reference: Mapping[str, tuple[tuple[int, ...], str]],
    *,
    serving: Mapping[str, int],
) -> None:
    """Raise :class:`WeightMismatchError` unless every name exists with the same shape."""
    problems: list[str] = []
    for name, shape in names_shapes:
        ref = reference.get(name)
        if ref is None:
            problems.append(f"unknown tensor {name!r}")
        elif tuple(shape) != ref[0]:
            problems.append(f"{name}: shape {tuple(shape)} != served {ref[0]}")
        if len(problems) >= 5:
            break
    if problems:
        raise WeightMismatchError(
            "publication refused before pausing: " + "; ".join(problems), serving=dict(serving)
        )


def expand_fused(changed: set[str], all_names: Iterable[str]) -> set[str]:
    """``changed`` plus every checkpoint sibling fused with one of them."""
    names = set(all_names)
    out = set(changed)
    for name in changed:
        for group in FUSED_SIBLINGS:
            for member in group:
                token = f".{member}."
                if token in name:
                    for other in group:
                        sib = name.replace(token, f".{other}.")
                        if sib in names:
                            out.add(sib)
    return out


class ServedWeights:
    """The tensors every engine serves (CPU copy), for diffs and rollback."""

    def __init__(self, reference: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        self.reference = dict(reference)
        self.tensors: dict[str, Any] = {}

    @classmethod
    def from_checkpoint(cls, directory: Path, *, load: bool = True) -> ServedWeights:
        served = cls(read_safetensors_meta(directory))
        if load:
            from safetensors.torch import load_file

            for f in sorted(directory.glob("*.safetensors")):
                served.tensors.update(load_file(str(f)))
        return served

    def changed(self, new: Mapping[str, Any], *, compact: bool) -> dict[str, Any]:
        """The tensors of ``new`` to send: all of them, or (compact) those that differ from
        what is served, expanded to whole fused parameters."""
        if not compact or not self.tensors:
            return dict(new)
        import torch

        diff = {n for n, t in new.items() if n not in self.tensors or not torch.equal(self.tensors[n], t)}
        keep = expand_fused(diff, set(new) | set(self.tensors))
        return {n: new[n] if n in new else self.tensors[n] for n in sorted(keep)}

    def previous_of(self, names: Iterable[str]) -> dict[str, Any]:
        """The served tensors under ``names`` (what a rollback re-sends)."""
        return {n: self.tensors[n] for n in names if n in self.tensors}

    def commit(self, sent: Mapping[str, Any]) -> None:
        for n, t in sent.items():
            self.tensors[n] = t.detach().to("cpu", copy=True)
