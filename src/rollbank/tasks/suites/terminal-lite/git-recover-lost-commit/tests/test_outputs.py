# git runs as nobody (uid 65534) in a child, never as root: programs from the repository's config
# (hooks, fsmonitor, filters, external diff) cannot write /logs/verifier or signal this runner.
import os, subprocess, tempfile

REPO = "/app/repo"
_HOME = tempfile.mkdtemp(prefix="git-home-")
os.chown(_HOME, 65534, 65534)
ENV = {"PATH": "/usr/bin:/bin", "HOME": _HOME, "GIT_CONFIG_NOSYSTEM": "1",
       "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0"}


def git(*a):
    r = subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, *a],
                       user=65534, group=65534, extra_groups=[], env=ENV, cwd="/",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"git {a!r} failed: {r.stderr[-2000:]}"
    return r.stdout.strip()


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
