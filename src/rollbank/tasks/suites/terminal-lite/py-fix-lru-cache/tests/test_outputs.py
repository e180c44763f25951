import json, os, random, subprocess, sys, tempfile
from collections import OrderedDict

# The agent's module runs in a child process as nobody, never imported here: code under test
# cannot write /logs/verifier or signal this runner, so it cannot forge the reward.
CHILD = r"""
import json, sys
sys.path.insert(0, "/app")
from lru import LRUCache

out = []
for cap, ops in json.load(sys.stdin):
    c = LRUCache(cap)
    trace = []
    for op in ops:
        if op[0] == "put":
            c.put(op[1], op[2])
            trace.append([None, len(c)])
        else:
            trace.append([c.get(op[1], op[2]), len(c)])
    out.append({"trace": trace, "hits": c.hits, "misses": c.misses})
print(json.dumps(out))
"""


def agent_run(runs):
    home = tempfile.mkdtemp()
    os.chown(home, 65534, 65534)
    r = subprocess.run([sys.executable, "-I", "-c", CHILD], input=json.dumps(runs),
                       user=65534, group=65534, extra_groups=[], cwd=home,
                       env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home},
                       capture_output=True, text=True, timeout=40)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(got, list) and len(got) == len(runs)
    for g, (_, ops) in zip(got, runs):
        assert len(g["trace"]) == len(ops)
    return got


class Ref:
    def __init__(self, cap):
        self.cap, self.d, self.hits, self.misses = cap, OrderedDict(), 0, 0
    def get(self, k, default=None):
        if k in self.d:
            self.hits += 1
            self.d.move_to_end(k)
            return self.d[k]
        self.misses += 1
        return default
    def put(self, k, v):
        self.d[k] = v
        self.d.move_to_end(k)
        while len(self.d) > self.cap:
            self.d.popitem(last=False)

def test_capacity_zero():
    (got,) = agent_run([[0, [["put", "a", 1], ["get", "a", "dflt"]]]])
    (_, n), (value, _) = got["trace"]
    assert n == 0 and value == "dflt"

def test_against_reference():
    r = random.Random(21)
    runs = []
    for cap in (1, 2, 3, 5):
        ops = []
        for _ in range(2000):
            k = r.choice("abcdefg")
            if r.random() < 0.5:
                ops.append(["put", k, r.randint(0, 99)])
            else:
                ops.append(["get", k, -1])
        runs.append([cap, ops])
    for (cap, ops), got in zip(runs, agent_run(runs)):
        ref = Ref(cap)
        for op, (value, n) in zip(ops, got["trace"]):
            if op[0] == "put":
                ref.put(op[1], op[2])
            else:
                assert value == ref.get(op[1], op[2]), (cap, op)
            assert n == len(ref.d), (cap, op)
        assert (got["hits"], got["misses"]) == (ref.hits, ref.misses)
