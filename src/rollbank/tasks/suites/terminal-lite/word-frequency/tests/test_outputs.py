import random

def make_text():
    r = random.Random(2024)
    vocab = ["river", "stone", "lantern", "orbit", "copper", "meadow", "signal", "harbor",
             "ember", "violet", "thunder", "cipher", "glacier", "needle", "compass", "falcon",
             "quartz", "willow", "anchor", "prism", "tundra", "beacon", "saffron", "marble"]
    weights = [60, 55, 51, 47, 44, 40, 37, 33, 30, 27, 24, 22, 20, 18, 16, 14, 12, 10, 9, 8, 7, 6, 5, 4]
    out = []
    for _ in range(400):
        n = r.randint(6, 14)
        words = r.choices(vocab, weights=weights, k=n)
        words = [w.capitalize() if r.random() < 0.2 else (w.upper() if r.random() < 0.05 else w) for w in words]
        out.append(" ".join(words) + r.choice([".", "!", "?", ";", ","]))
    return "\n".join(out) + "\n"

import re
from collections import Counter
from pathlib import Path

def expected():
    c = Counter(re.findall(r"[a-z]+", make_text().lower()))
    return [f"{w} {n}" for w, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:10]]

def test_top10():
    got = [ln.strip() for ln in Path("/app/top10.txt").read_text().strip().splitlines()]
    assert got == expected()
