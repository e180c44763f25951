import os, subprocess
from pathlib import Path

REPO = Path(os.environ.get("REPO", "/app/repo"))
_T = [1704067200]

def git(*args, check=True):
    env = dict(os.environ)
    _T[0] += 3600
    env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{_T[0]} +0000"
    return subprocess.run(["git", *args], cwd=REPO, env=env, check=check, capture_output=True, text=True).stdout

def write(path, text):
    p = REPO / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)

def commit(msg, **files):
    for k, v in files.items():
        write(k.replace("__", "/").replace("_DOT_", "."), v)
    git("add", "-A")
    git("commit", "-q", "-m", msg)

def init():
    REPO.mkdir(parents=True, exist_ok=True)
    git("init", "-q", "-b", "main")
