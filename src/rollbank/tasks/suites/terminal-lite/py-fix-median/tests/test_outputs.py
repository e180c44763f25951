import json, random, subprocess, sys

# The agent's module runs in a child process as nobody, never imported here: code under test
# cannot write /logs/verifier or signal this runner, so it cannot forge the reward.
CHILD = r"""
import json, sys
sys.path.insert(0, "/app")
import stats
out = []
for xs in json.load(sys.stdin):
    copy = list(xs)
    out.append([stats.median(xs), xs == copy])
print(json.dumps({"mean": stats.mean([1, 2, 3, 4]), "medians": out}))
"""


def agent_run(cases):
    r = subprocess.run([sys.executable, "-I", "-c", CHILD], input=json.dumps(cases),
                       user=65534, group=65534, extra_groups=[], cwd="/tmp",
                       env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_known():
    got = agent_run([[5, 1, 3], [4, 1, 3, 2], [7]])
    assert [m for m, _ in got["medians"]] == [3, 2.5, 7]
    assert got["mean"] == 2.5


def test_random_against_reference():
    import statistics
    r = random.Random(3)
    cases = [[r.randint(-50, 50) for _ in range(r.randint(1, 12))] for _ in range(200)]
    got = agent_run(cases)["medians"]
    assert len(got) == len(cases)
    for xs, (m, unchanged) in zip(cases, got):
        assert m == statistics.median(xs), xs
        assert unchanged, "median() must not modify its argument"
