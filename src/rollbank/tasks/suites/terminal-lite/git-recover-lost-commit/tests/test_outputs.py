import subprocess

def git(*a):
    return subprocess.run(["git", "-C", "/app/repo", *a], capture_output=True, text=True, check=True).stdout.strip()

def test_main_has_recovered_commit():
    assert git("log", "-1", "--format=%s", "main") == "Add retry budget to scheduler"
    assert git("log", "-1", "--format=%s", "main~1") == "Document usage"
    assert git("rev-list", "--count", "main") == "4"
    src = git("show", "main:scheduler.py")
    assert "RETRY_BUDGET = 3" in src and "def may_retry" in src

def test_worktree_clean():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain") == ""
    assert "def may_retry" in open("/app/repo/scheduler.py").read()
