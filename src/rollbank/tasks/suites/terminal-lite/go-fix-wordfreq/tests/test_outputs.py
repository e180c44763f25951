import subprocess
from collections import Counter

TEXT = """The cat and the hat. THE END; and (cat) 'hat' dog!
zebra yak yak zebra the: and? cat"""

def expected(text, n):
    c = Counter(w for w in (t.strip(".,;:!?\"'()").lower() for t in text.split()) if w)
    return [f"{w} {k}" for w, k in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]

def run(binary, args, text):
    r = subprocess.run([binary, *args], input=text, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()

def test_built_binary():
    assert run("/app/wordfreq/bin/wordfreq", [], TEXT) == expected(TEXT, 3)

def test_rebuild_and_behaviour():
    r = subprocess.run(["go", "build", "-o", "/tmp/wf-verify", "."], cwd="/app/wordfreq",
                       capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    assert run("/tmp/wf-verify", ["5"], TEXT) == expected(TEXT, 5)
    big = " ".join(f"w{i % 37} W{i % 11}." for i in range(3000))
    assert run("/tmp/wf-verify", ["8"], big) == expected(big, 8)
