import subprocess

def git(*a):
    return subprocess.run(["git", "-C", "/app/repo", *a], capture_output=True, text=True, check=True).stdout.strip()

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
