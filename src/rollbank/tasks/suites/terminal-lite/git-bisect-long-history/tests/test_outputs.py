import subprocess
from pathlib import Path

CASES = {0.125: 13, 2.675: 268, 1.005: 101, 3.14159: 314, 10: 1000}

def git(*a):
    return subprocess.run(["git", "-C", "/app/repo", *a], capture_output=True, text=True, check=True).stdout

def is_good(rev):
    ns = {}
    exec(git("show", f"{rev}:pricing.py"), ns)
    return all(ns["round_cents"](k) == v for k, v in CASES.items())

def test_first_bad_commit():
    h = Path("/app/first_bad.txt").read_text().strip()
    assert len(h) == 40 and all(c in "0123456789abcdef" for c in h)
    assert git("cat-file", "-t", h).strip() == "commit"
    assert git("rev-list", "--count", "main").strip() == "2400"
    subprocess.run(["git", "-C", "/app/repo", "merge-base", "--is-ancestor", h, "main"], check=True)
    assert not is_good(h), "that commit still rounds correctly"
    assert is_good(h + "^"), "its parent is already bad, so it is not the first bad commit"
