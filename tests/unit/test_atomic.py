"""The atomic directory write: a crash at any step leaves the old or the new directory whole.

Crashes are real: the write runs in a forked child that ``os._exit``s at the step (no
exception handler, no cleanup runs), then the parent looks at what is on disk. The checkpoint
writers (publication's ``write_checkpoint``, the trainer's ``write_version``, the model cache)
go through the same helper and are checked with an injected failing step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rollbank.atomic import STEPS, recover, write_dir


def _files(content: str) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        (d / "a.txt").write_text(content)
        (d / "sub").mkdir()
        (d / "sub" / "b.txt").write_text(content * 2)

    return write


def _whole(d: Path) -> str | None:
    """The content a complete directory holds; None if absent or incomplete."""
    if not d.is_dir():
        return None
    a, b = d / "a.txt", d / "sub" / "b.txt"
    if not (a.is_file() and b.is_file()):
        return None
    content = a.read_text()
    return content if b.read_text() == content * 2 else None


def _crash_at(final: Path, step: str, *, replace: bool, fallback: bool) -> None:
    pid = os.fork()
    if pid == 0:  # the child: write, and die without cleanup at ``step``
        try:
            def hook(name: str) -> None:
                if name == step:
                    os._exit(17)

            write_dir(final, _files("new"), replace=replace, step=hook, fallback=fallback)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 17


@pytest.mark.parametrize("fallback", [False, True], ids=["exchange", "fallback"])
@pytest.mark.parametrize("step", STEPS)
def test_crash_while_replacing_leaves_old_or_new_whole(tmp_path: Path, step: str, fallback: bool) -> None:
    final = tmp_path / "v1"
    write_dir(final, _files("old"))
    _crash_at(final, step, replace=True, fallback=fallback)
    before_rename = STEPS.index(step) < STEPS.index("renamed")
    assert _whole(final) == ("old" if before_rename else "new")
    write_dir(final, _files("third"), replace=True, fallback=fallback)  # leftovers cleaned
    assert _whole(final) == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


@pytest.mark.parametrize("step", STEPS)
def test_crash_on_first_write_leaves_nothing_or_new(tmp_path: Path, step: str) -> None:
    final = tmp_path / "v1"
    _crash_at(final, step, replace=False, fallback=False)
    assert _whole(final) == (None if STEPS.index(step) < STEPS.index("renamed") else "new")
    if not final.exists():  # the next first write is not refused by the leftovers
        write_dir(final, _files("again"))
        assert _whole(final) == "again"


def test_failed_write_removes_its_tmp_and_keeps_the_old(tmp_path: Path) -> None:
    final = tmp_path / "v1"
    write_dir(final, _files("old"))

    def broken(d: Path) -> None:
        (d / "a.txt").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_dir(final, broken, replace=True)
    assert _whole(final) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


def test_existing_target_is_refused_without_replace(tmp_path: Path) -> None:
    final = tmp_path / "v1"
    write_dir(final, _files("old"))
    for fallback in (False, True):
        with pytest.raises(FileExistsError):
            write_dir(final, _files("new"), fallback=fallback)
    assert _whole(final) == "old"


def test_recover_puts_an_old_directory_back_after_a_crash_between_the_fallback_renames(
    tmp_path: Path,
) -> None:
    final = tmp_path / "v1"
    write_dir(final, _files("old"))
    final.rename(tmp_path / ".v1.old-123-abcd")  # the fallback's first rename, then a crash
    (tmp_path / ".v1.tmp-123-abcd").mkdir()  # its new directory, not yet renamed in
    recover(final)
    assert _whole(final) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


# ---------------------------------------------------------------- the writers that use it
def _fail_at(step: str) -> Callable[[str], None]:
    def hook(name: str) -> None:
        if name == step:
            raise OSError(5, f"injected failure at {step}")

    return hook


@pytest.mark.parametrize("step", STEPS)
def test_publication_checkpoint_rewrite_keeps_a_whole_checkpoint(tmp_path: Path, step: str) -> None:
    """Re-writing ``v1`` (a retried publication) with a failure at any step: ``v1`` is the old
    or the new checkpoint, complete. (The earlier writer deleted ``v1`` before its rename.)"""
    import torch
    from safetensors.torch import load_file

    from rollbank.inference.publishing.checkpoint import write_checkpoint

    template = tmp_path / "model"
    template.mkdir()
    (template / "config.json").write_text("{}")
    root = tmp_path / "ckpts"
    write_checkpoint({"w": torch.zeros(3)}, root, 1, template=template)
    try:
        write_checkpoint({"w": torch.ones(3)}, root, 1, template=template, step=_fail_at(step))
    except OSError as exc:
        assert "injected" in str(exc)
    final = root / "v1"
    assert (final / "config.json").is_file()
    w = load_file(str(final / "model.safetensors"))["w"]
    assert float(w.sum()) in (0.0, 3.0)
    if STEPS.index(step) >= STEPS.index("renamed"):
        assert float(w.sum()) == 3.0


@pytest.mark.parametrize("step", STEPS[:3])
def test_trainer_version_write_failure_leaves_no_version(tmp_path: Path, step: str) -> None:
    from rollbank.training.checkpoint import latest_version, write_version

    root = tmp_path / "weights"
    write_version(root, 1, lambda d: (d / "x").write_text("1"), {"kind": "full"})
    with pytest.raises(OSError, match="injected"):
        write_version(root, 2, lambda d: (d / "x").write_text("2"), {"kind": "full"}, step=_fail_at(step))
    assert not (root / "v000002").exists()
    assert latest_version(root) == 1
    assert (root / "v000001" / "x").read_text() == "1"
