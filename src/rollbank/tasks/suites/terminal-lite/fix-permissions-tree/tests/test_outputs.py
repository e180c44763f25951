import os, stat
from pathlib import Path

ROOT = Path("/app/site")

def mode(p):
    return stat.S_IMODE(os.lstat(p).st_mode)

def test_dirs_755():
    ds = [ROOT] + [p for p in ROOT.rglob("*") if p.is_dir() and p.name != "secrets"]
    assert len(ds) == 5
    assert {str(p): oct(mode(p)) for p in ds} == {str(p): "0o755" for p in ds}

def test_files_644():
    fs = [p for p in ROOT.rglob("*") if p.is_file() and p.parent.name not in ("bin", "secrets")]
    assert len(fs) == 4
    assert {str(p): oct(mode(p)) for p in fs} == {str(p): "0o644" for p in fs}

def test_scripts_755():
    fs = sorted((ROOT / "bin").iterdir())
    assert len(fs) == 2
    assert [oct(mode(p)) for p in fs] == ["0o755", "0o755"]

def test_secrets_private():
    assert oct(mode(ROOT / "secrets")) == "0o700"
    fs = sorted((ROOT / "secrets").iterdir())
    assert len(fs) == 2
    assert [oct(mode(p)) for p in fs] == ["0o600", "0o600"]
