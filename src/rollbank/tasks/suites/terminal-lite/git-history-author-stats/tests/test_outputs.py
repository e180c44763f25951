import subprocess
from collections import Counter
from pathlib import Path

def git(*a):
    return subprocess.run(["git", "-C", "/app/repo", *a], capture_output=True, text=True, check=True).stdout

def test_counts():
    assert git("rev-list", "--count", "main").strip() == "2500"
    assert git("log", "-1", "--format=%s", "v1.0").strip() == "Release 1.0"
    assert git("log", "-1", "--format=%s", "v2.0").strip() == "Release 2.0"
    c = Counter(git("log", "--format=%ae", "v1.0..v2.0", "--", "src/core/").split())
    want = [f"{n} {e}" for e, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]
    got = [" ".join(ln.split()) for ln in Path("/app/core_authors.txt").read_text().strip().splitlines()]
    assert len(want) >= 10
    assert got == want
