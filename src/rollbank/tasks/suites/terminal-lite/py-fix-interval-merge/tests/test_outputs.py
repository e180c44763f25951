import json, os, random, subprocess, sys, tempfile

# The agent's package runs in a child process as nobody, never imported here: code under test
# cannot write /logs/verifier or signal this runner, so it cannot forge the reward.
CHILD = r"""
import json, sys
sys.path.insert(0, "/app")
from intervals import merge

def enc(v):
    if isinstance(v, tuple):
        return {"tuple": [enc(x) for x in v]}
    if isinstance(v, list):
        return [enc(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"other": repr(v)}

out = []
for case in json.load(sys.stdin):
    iv = [tuple(p) for p in case]
    before = list(iv)
    got = merge(iv)
    out.append([enc(got), iv == before])
print(json.dumps(out))
"""


class Other:
    def __init__(self, r):
        self.r = r

    def __repr__(self):
        return self.r


def dec(v):
    if isinstance(v, dict):
        if list(v) == ["tuple"]:
            return tuple(dec(x) for x in v["tuple"])
        return Other(repr(v))  # equal to nothing the test expects
    if isinstance(v, list):
        return [dec(x) for x in v]
    return v


def agent_run(cases):
    home = tempfile.mkdtemp()
    os.chown(home, 65534, 65534)
    r = subprocess.run([sys.executable, "-I", "-c", CHILD], input=json.dumps(cases),
                       user=65534, group=65534, extra_groups=[], cwd=home,
                       env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                       capture_output=True, text=True, timeout=40)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(got, list) and len(got) == len(cases)
    return [(dec(m), unchanged) for m, unchanged in got]


def reference(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]


def test_visible_cases():
    got = agent_run([[(1, 3), (2, 6), (8, 10)], [(1, 3), (3, 5)], [(1, 10), (2, 3)], []])
    assert [m for m, _ in got] == [[(1, 6), (8, 10)], [(1, 5)], [(1, 10)], []]


def test_random():
    r = random.Random(8)
    cases = []
    for _ in range(300):
        iv = []
        for _ in range(r.randint(0, 9)):
            s = r.randint(0, 40)
            iv.append((s, s + r.randint(0, 8)))
        cases.append(iv)
    got = agent_run(cases)
    for iv, (m, unchanged) in zip(cases, got):
        assert m == reference(iv), iv
        assert unchanged, "merge() must not modify its input"
