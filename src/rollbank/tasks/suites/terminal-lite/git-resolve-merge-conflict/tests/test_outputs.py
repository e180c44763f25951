# git runs as nobody (uid 65534) in a child, never as root: programs from the repository's config
# (hooks, fsmonitor, filters, external diff) cannot write /logs/verifier or signal this runner.
import json, os, subprocess, sys, tempfile

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


# The agent's config.py is executed in a child as nobody too, never exec'd in this runner.
CONFIG_CHILD = r"""
import json, sys
ns = {}
exec(sys.stdin.read(), ns)
names = ["TIMEOUT_S", "MAX_RETRIES", "BACKOFF", "NAME", "LOG_LEVEL", "STRAGGLER_FACTOR"]
print(json.dumps({k: ns[k] for k in names if k in ns}))
"""


def config_values(src):
    r = subprocess.run([sys.executable, "-I", "-c", CONFIG_CHILD], input=src,
                       user=65534, group=65534, extra_groups=[], cwd="/",
                       env={"PATH": "/usr/bin:/bin", "HOME": _HOME},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_merge_commit():
    parents = git("log", "-1", "--format=%P", "main").split()
    assert len(parents) == 2
    assert git("rev-parse", "feature/retries") in parents
    assert git("log", "-1", "--format=%s", parents[0]) == "Tune timeout"

def test_content_values():
    src = git("show", "main:config.py")
    assert "<<<<<<<" not in src and ">>>>>>>" not in src and "=======" not in src
    ns = config_values(src)
    assert ns.get("TIMEOUT_S") == 120 and ns.get("MAX_RETRIES") == 4 and ns.get("BACKOFF") == 1.5
    assert ns.get("NAME") == "collector" and ns.get("LOG_LEVEL") == "info" and ns.get("STRAGGLER_FACTOR") == 2.0
    assert "config.BACKOFF" in git("show", "main:app.py")

def test_clean_tree():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    parents = git("log", "-1", "--format=%P", "main").split()
    assert len(parents) == 2
