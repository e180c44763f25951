import os, shutil, subprocess, tempfile

# The agent's code (its Makefile, the compiler on its source, csum) runs in a child process as
# nobody, in a copy of /app: it cannot write /logs/verifier or signal this runner.
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


def as_nobody(argv, cwd, home, **kw):
    return subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], cwd=cwd,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                          capture_output=True, text=True, timeout=40, **kw)


def test_build_and_behaviour():
    assert "-Werror" in open("/app/Makefile").read()
    work, home = copy_app(), nobody_dir()
    as_nobody(["make", "clean"], work, home)
    r = as_nobody(["make"], work, home)
    assert r.returncode == 0, r.stderr
    # the input lives in a root-owned directory the child can read but not change
    data_dir = tempfile.mkdtemp()
    os.chmod(data_dir, 0o755)
    data = bytes(range(256)) * 37 + b"tail"
    p = os.path.join(data_dir, "blob.bin")
    with open(p, "wb") as f:
        f.write(data)
    os.chmod(p, 0o644)
    out = as_nobody(["./csum", p], work, home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(len(data)), str(sum(data) % 2**32), p]
    bad = as_nobody(["./csum", p, "/nonexistent/x"], work, home)
    assert bad.returncode == 1 and bad.stdout.startswith(str(len(data)))
