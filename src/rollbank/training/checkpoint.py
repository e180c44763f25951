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
  step and the root is fsync'd. A version is written at most once.
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


def _fsync(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath) / name)
        _fsync(Path(dirpath), directory=True)


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Copy the tokenizer files of a model folder (those that exist) into ``dst``."""
    for name in TOKENIZER_FILES:
        if (src / name).is_file() and not (dst / name).exists():
            shutil.copy2(src / name, dst / name)


def write_version(
    root: Path, version: int, write: Callable[[Path], object], meta: dict[str, Any]
) -> Path:
    """Run ``write(tmp_dir)`` and publish ``tmp_dir`` as ``root/vNNNNNN`` atomically."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / version_dir_name(version)
    if final.exists():
        raise FileExistsError(f"{final} already exists; a weight version is written once")
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write(tmp)
        (tmp / META_NAME).write_text(json.dumps({"version": version, **meta}, indent=2, sort_keys=True))
        _fsync_tree(tmp)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(root, directory=True)
    latest_tmp = root / f".{LATEST_NAME}.tmp-{os.getpid()}"
    latest_tmp.write_text(f"{version}\n")
    _fsync(latest_tmp)
    latest_tmp.replace(root / LATEST_NAME)
    _fsync(root, directory=True)
    return final


def read_meta(path: Path) -> dict[str, Any]:
    """The ``rollbank_weights.json`` of a version directory."""
    meta: dict[str, Any] = json.loads((path / META_NAME).read_text())
    return meta


def latest_version(root: Path) -> int | None:
    """The version named by ``root/LATEST`` (None before the first write)."""
    p = root / LATEST_NAME
    return int(p.read_text().strip()) if p.is_file() else None
