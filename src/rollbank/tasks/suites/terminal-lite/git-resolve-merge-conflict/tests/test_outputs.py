import subprocess

def git(*a):
    return subprocess.run(["git", "-C", "/app/repo", *a], capture_output=True, text=True, check=True).stdout.strip()

def test_merge_commit():
    parents = git("log", "-1", "--format=%P", "main").split()
    assert len(parents) == 2
    assert git("rev-parse", "feature/retries") in parents
    assert git("log", "-1", "--format=%s", parents[0]) == "Tune timeout"

def test_content_values():
    src = git("show", "main:config.py")
    assert "<<<<<<<" not in src and ">>>>>>>" not in src and "=======" not in src
    ns = {}
    exec(src, ns)
    assert ns["TIMEOUT_S"] == 120 and ns["MAX_RETRIES"] == 4 and ns["BACKOFF"] == 1.5
    assert ns["NAME"] == "collector" and ns["LOG_LEVEL"] == "info" and ns["STRAGGLER_FACTOR"] == 2.0
    assert "config.BACKOFF" in git("show", "main:app.py")

def test_clean_tree():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    parents = git("log", "-1", "--format=%P", "main").split()
    assert len(parents) == 2
