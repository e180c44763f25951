import os, shutil, subprocess, tempfile

# The agent's code (its Makefile, the compiler on the sources, wordstat) runs in a child process
# as nobody, in a copy of /app: it cannot write /logs/verifier or signal this runner.
NOBODY = 65534


def nobody_dir():
    d = tempfile.mkdtemp()
    os.chown(d, NOBODY, NOBODY)
    return d


def copy_app():
    """A copy of /app owned by nobody (make needs a tree it may write), in a fresh directory."""
    work = os.path.join(nobody_dir(), "app")
    shutil.copytree("/app", work, symlinks=True)
    for top, dirs, files in os.walk(work):
        for p in [top] + [os.path.join(top, n) for n in dirs + files]:
            os.chown(p, NOBODY, NOBODY, follow_symlinks=False)
    return work


def run(cmd, cwd, home, **kw):
    return subprocess.run(cmd, user=NOBODY, group=NOBODY, extra_groups=[], cwd=cwd,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                          capture_output=True, text=True, timeout=60, **kw)

def test_make_builds_from_scratch():
    work, home = copy_app(), nobody_dir()
    r = run(["make", "clean"], work, home)
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(os.path.join(work, "bin/wordstat"))
    r = run(["make"], work, home)
    assert r.returncode == 0, r.stdout + r.stderr
    out = run(["./bin/wordstat"], work, home, input="hello brave  new\nworld\n\n")
    assert out.stdout.split() == ["3", "4", "24"]

def test_sources_unchanged():
    src = open("/app/src/util.c").read()
    assert "size_t count_chars(const char *s) { return strlen(s); }" in src
    assert "count_words(buf)" in open("/app/src/main.c").read()
