# The agent's slugify.js runs only under node in a child process as nobody, never as root: it
# cannot write /logs/verifier or signal this runner, so it cannot forge the reward.
import os, subprocess, tempfile

NOBODY = 65534


def node(script, cwd=None):
    home = tempfile.mkdtemp()
    os.chown(home, NOBODY, NOBODY)
    return subprocess.run(["node", script], user=NOBODY, group=NOBODY, extra_groups=[],
                          cwd=cwd or home, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                          capture_output=True, text=True, timeout=30)


def test_hidden_cases():
    r = node("/tests/hidden.js")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "hidden ok" in r.stdout


def test_visible_suite():
    r = node("/app/test.js", cwd="/app")
    assert r.returncode == 0, r.stderr[-2000:]
