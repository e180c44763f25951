"""Versioned weight directories, written atomically (what publication hot-loads).

Layout under a run's ``weights/`` root::

    weights/
      v000001/                  # full: config.json, model.safetensors (HF layout), tokenizer
        rollbank_weights.json   # LoRA: adapter_config.json, adapter_model.safetensors (PEFT)
      v000002/ ...
      LATEST                    # newest complete version (text)

Invariants
- A ``vNNNNNN`` directory is complete whenever it exists: it is written as a hidden temporary
  directory, every file and the directory are fsync'd, then it is renamed into place in one
  step and the root is fsync'd (:func:`rollbank.atomic.write_dir`). A version is written at most once.
- ``rollbank_weights.json`` says what the directory holds (``kind`` = ``full`` | ``lora``,
  the version, the base model for a LoRA adapter) so a loader need not guess.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollbank.atomic import StepHook, fsync_path, write_dir

META_NAME = "rollbank_weights.json"
LATEST_NAME = "LATEST"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "chat_template.jinja", "chat_template.json", "generation_config.json",
)


def version_dir_name(version: int) -> str:
    if version < 0:
        raise ValueError("a weight version is >= 0")
    return f"v{version:06d}"


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Copy the tokenizer files of a model folder (those that exist) into ``dst``."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)


def write_version(
    root: Path, version: int, write: Callable[[Path], object], meta: dict[str, Any],
    *, step: StepHook | None = None,
) -> Path:
    """Run ``write(tmp_dir)`` and publish ``tmp_dir`` as ``root/vNNNNNN`` atomically."""
    final = root / version_dir_name(version)
    if final.exists():
        raise FileExistsError(f"{final} already exists; a weight version is written once")

    def fill(tmp: Path) -> None:
        write(tmp)
        (tmp / META_NAME).write_text(json.dumps({"version": version, **meta}, indent=2, sort_keys=True))

    write_dir(final, fill, step=step)
    latest_tmp = root / f".{LATEST_NAME}.tmp-{os.getpid()}"
    latest_tmp.write_text(f"{version}\n")
    fsync_path(latest_tmp)
    latest_tmp.replace(root / LATEST_NAME)
    fsync_path(root, directory=True)
    return final


def read_meta(path: Path) -> dict[str, Any]:
    """The ``rollbank_weights.json`` of a version directory."""
    meta: dict[str, Any] = json.loads((path / META_NAME).read_text())
    return meta


def latest_version(root: Path) -> int | None:
    """The version named by ``root/LATEST`` (None before the first write)."""
    p = root / LATEST_NAME
    return int(p.read_text().strip()) if p.is_file() else None
