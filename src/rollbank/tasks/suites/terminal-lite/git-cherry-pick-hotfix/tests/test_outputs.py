import subprocess

def git(*a):
    return subprocess.run(["git", "-C", "/app/repo", *a], capture_output=True, text=True, check=True).stdout.strip()

def test_fix_on_main():
    assert git("log", "-1", "--format=%s", "main") == "Fix off-by-one in paginate"
    assert git("log", "-1", "--format=%s", "main~1") == "Release 2.0.0"
    ns = {}
    exec(git("show", "main:pager.py"), ns)
    assert ns["paginate"](list(range(10)), 1, 3) == [3, 4, 5]

def test_nothing_else():
    assert git("show", "main:VERSION") == "2.0.0"
    assert "1.3.1" not in git("show", "main:CHANGELOG.md")
    assert git("rev-list", "--count", "main") == "4"
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain") == ""
