# The agent's /app/rotate.sh (and every read or write of the directory it rotates) runs in a
# child process as nobody, never as root here: it cannot write /logs/verifier or signal this runner.
import json, os, shutil, subprocess, sys, tempfile

NOBODY = 65534
_PUT = "import sys\nfor name, text in zip(sys.argv[2::2], sys.argv[3::2]):\n" \
       "    open(sys.argv[1] + '/' + name, 'w').write(text)\n"
_STATE = "import json, os, sys\nd = sys.argv[1]\n" \
         "print(json.dumps({n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d))}))\n"


def nobody_dir():
    d = tempfile.mkdtemp()
    os.chown(d, NOBODY, NOBODY)
    return d


def as_nobody(argv, timeout=10):
    home = nobody_dir()
    return subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], cwd=home,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                          capture_output=True, text=True, timeout=timeout)


def script():
    """A root-owned copy of /app/rotate.sh in a directory the child cannot write, executable
    by nobody (root ran any file with an x bit; the copy keeps its bytes)."""
    src = "/app/rotate.sh"
    assert os.path.isfile(src) and os.access(src, os.X_OK), "/app/rotate.sh is not executable"
    d = tempfile.mkdtemp()
    os.chmod(d, 0o755)
    dst = os.path.join(d, "rotate.sh")
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755)
    return dst


def rot(d, rotate):
    return as_nobody([rotate, str(d)])


def put(d, **files):
    args = [x for name, text in files.items() for x in (name, text)]
    r = as_nobody([sys.executable, "-I", "-c", _PUT, d, *args])
    assert r.returncode == 0, r.stderr[-2000:]


def state(d):
    r = as_nobody([sys.executable, "-I", "-c", _STATE, d])
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_sequence():
    rotate, d = script(), nobody_dir()
    put(d, **{"other.txt": "keep", "app.log": "gen1"})
    for i in range(2, 6):
        assert rot(d, rotate).returncode == 0
        put(d, **{"app.log": f"gen{i}"})
    assert state(d) == {"app.log": "gen5", "app.log.1": "gen4", "app.log.2": "gen3",
                        "app.log.3": "gen2", "other.txt": "keep"}
    assert rot(d, rotate).returncode == 0
    assert state(d) == {"app.log": "", "app.log.1": "gen5", "app.log.2": "gen4",
                        "app.log.3": "gen3", "other.txt": "keep"}


def test_gaps():
    rotate, d = script(), nobody_dir()
    put(d, **{"app.log.2": "old2"})
    assert rot(d, rotate).returncode == 0
    assert state(d) == {"app.log": "", "app.log.3": "old2"}


def test_bad_dir():
    rotate = script()
    d = tempfile.mkdtemp()  # the test's own: root-owned, the child cannot write it
    os.chmod(d, 0o755)
    r = rot(os.path.join(d, "nope"), rotate)
    assert r.returncode == 2 and r.stderr.strip()
    with open(os.path.join(d, "f"), "w") as f:
        f.write("x")
    os.chmod(os.path.join(d, "f"), 0o644)
    assert rot(os.path.join(d, "f"), rotate).returncode == 2
