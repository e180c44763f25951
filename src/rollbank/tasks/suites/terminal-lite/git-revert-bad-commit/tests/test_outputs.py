import subprocess

def git(*a):
    return subprocess.run(["git", "-C", "/app/repo", *a], capture_output=True, text=True, check=True).stdout.strip()

def test_history_kept():
    subjects = git("log", "--format=%s", "main").splitlines()
    assert subjects[1:] == ["Cli prints count", "Add docs", "Switch parser to strict mode", "Add cli", "Add parser"]
    assert git("rev-parse", "main~1^{tree}") != git("rev-parse", "main^{tree}")

def test_reverted_content():
    assert git("show", "main:parser.py").startswith("STRICT = False")
    assert "print(len(r), r)" in git("show", "main:cli.py")
    assert git("show", "main:docs.md") == "Parser splits on commas."
    assert git("status", "--porcelain") == ""
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
