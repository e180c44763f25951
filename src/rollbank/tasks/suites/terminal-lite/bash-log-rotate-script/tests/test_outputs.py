import subprocess
from pathlib import Path

def rot(d):
    return subprocess.run(["/app/rotate.sh", str(d)], capture_output=True, text=True, timeout=10)

def state(d):
    return {p.name: p.read_text() for p in sorted(Path(d).iterdir())}

def test_sequence(tmp_path):
    (tmp_path / "other.txt").write_text("keep")
    (tmp_path / "app.log").write_text("gen1")
    for i in range(2, 6):
        assert rot(tmp_path).returncode == 0
        (tmp_path / "app.log").write_text(f"gen{i}")
    assert state(tmp_path) == {"app.log": "gen5", "app.log.1": "gen4", "app.log.2": "gen3",
                               "app.log.3": "gen2", "other.txt": "keep"}
    assert rot(tmp_path).returncode == 0
    assert state(tmp_path) == {"app.log": "", "app.log.1": "gen5", "app.log.2": "gen4",
                               "app.log.3": "gen3", "other.txt": "keep"}

def test_gaps(tmp_path):
    (tmp_path / "app.log.2").write_text("old2")
    assert rot(tmp_path).returncode == 0
    assert state(tmp_path) == {"app.log": "", "app.log.3": "old2"}

def test_bad_dir(tmp_path):
    r = rot(tmp_path / "nope")
    assert r.returncode == 2 and r.stderr.strip()
    (tmp_path / "f").write_text("x")
    assert rot(tmp_path / "f").returncode == 2
