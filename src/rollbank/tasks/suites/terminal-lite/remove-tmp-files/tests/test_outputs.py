from pathlib import Path

def test_no_tmp_left():
    left = [p for p in Path("/app/work").rglob("*.tmp")]
    assert left == [], left

def test_others_kept():
    kept = sorted(str(p.relative_to("/app/work")) for p in Path("/app/work").rglob("*") if p.is_file())
    assert len(kept) == 14, kept
    assert Path("/app/work/a/notes.tmp.bak").is_file()
    assert Path("/app/work/c/tmp.csv").is_file()
