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


def test_single_commit():
    assert git("rev-list", "--count", "main..feature/csv") == "1"
    assert git("log", "-1", "--format=%s", "feature/csv") == "Add CSV exporter"
    assert git("rev-parse", "feature/csv~1") == git("rev-parse", "main")
    assert git("log", "-1", "--format=%s", "main") == "Add README"

def test_same_tree():
    files = sorted(git("ls-tree", "-r", "--name-only", "feature/csv").splitlines())
    assert files == ["README.md", "app.py", "export.py", "test_export.py"]
    assert git("show", "feature/csv:export.py").startswith("import csv\nimport sys")
    assert "def test_export" in git("show", "feature/csv:test_export.py")
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "feature/csv"
    assert git("status", "--porcelain") == ""
