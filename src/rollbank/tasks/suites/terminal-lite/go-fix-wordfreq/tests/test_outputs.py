# The agent's code (its go build and every binary built from it) runs in a child process as
# nobody, never as root here: it cannot write /logs/verifier or signal this runner.
import os, subprocess, tempfile
from collections import Counter

NOBODY = 65534
TEXT = """The cat and the hat. THE END; and (cat) 'hat' dog!
zebra yak yak zebra the: and? cat"""


def expected(text, n):
    c = Counter(w for w in (t.strip(".,;:!?\"'()").lower() for t in text.split()) if w)
    return [f"{w} {k}" for w, k in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def nobody_dir():
    d = tempfile.mkdtemp()
    os.chown(d, NOBODY, NOBODY)
    return d


def as_nobody(argv, cwd=None, timeout=20, **kw):
    home = nobody_dir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "GOTOOLCHAIN": "local",
           "GOPROXY": "off", "GOCACHE": os.path.join(home, ".cache", "go-build"),
           "GOPATH": os.path.join(home, "go")}
    return subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], cwd=cwd or home,
                          env=env, capture_output=True, text=True, timeout=timeout, **kw)


def run(binary, args, text):
    r = as_nobody([binary, *args], input=text)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()


def test_built_binary():
    assert run("/app/wordfreq/bin/wordfreq", [], TEXT) == expected(TEXT, 3)


def test_rebuild_and_behaviour():
    out = os.path.join(nobody_dir(), "wf-verify")
    r = as_nobody(["go", "build", "-buildvcs=false", "-o", out, "."], cwd="/app/wordfreq",
                  timeout=100)
    assert r.returncode == 0, r.stderr
    assert run(out, ["5"], TEXT) == expected(TEXT, 5)
    big = " ".join(f"w{i % 37} W{i % 11}." for i in range(3000))
    assert run(out, ["8"], big) == expected(big, 8)
