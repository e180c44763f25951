import random

def make_app_log():
    r = random.Random(17)
    comps = ["scheduler", "router", "sandbox", "verifier", "bank"]
    msgs = {"INFO": ["episode done", "batch flushed", "ERROR budget nominal"],
            "WARN": ["retrying after ERROR from upstream", "slow step"],
            "ERROR": ["sandbox died", "verifier timeout", "connection reset"],
            "DEBUG": ["tick"]}
    t = 1709596800  # 2024-03-05T00:00:00Z
    lines = []
    for _ in range(6000):
        t += r.randint(1, 40)
        lvl = r.choices(["INFO", "WARN", "ERROR", "DEBUG"], weights=[70, 12, 8, 10])[0]
        d, rem = divmod(t - 1709596800, 86400)
        hh, mm, ss = rem // 3600, (rem // 60) % 60, rem % 60
        lines.append(f"2024-03-{5 + d:02d}T{hh:02d}:{mm:02d}:{ss:02d}Z {lvl} {r.choice(comps)}: {r.choice(msgs[lvl])}")
    return "\n".join(lines) + "\n"

import json
from collections import Counter
from pathlib import Path

def test_counts():
    want = Counter(ln[:13] for ln in make_app_log().splitlines() if ln.split()[1] == "ERROR")
    got = json.loads(Path("/app/errors_per_hour.json").read_text())
    assert {k: int(v) for k, v in got.items()} == dict(want)
