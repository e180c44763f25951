"""Builds /app/repo: a long linear history with one behaviour change hidden in it."""
import os, random, subprocess
from pathlib import Path

REPO = Path("/app/repo")
N = 2400
BAD = 1733  # 1-based index of the first bad commit
r = random.Random(1234)

GOOD = [
    "from decimal import ROUND_HALF_UP, Decimal\n\n\ndef round_cents(amount):\n    \"\"\"Dollars (float or str) -> integer cents, half-up.\"\"\"\n    return int(Decimal(str(amount)).scaleb(2).quantize(Decimal(1), rounding=ROUND_HALF_UP))\n",
    "from decimal import ROUND_HALF_UP, Decimal\n\n\ndef round_cents(amount):\n    cents = Decimal(str(amount)) * 100\n    return int(cents.to_integral_value(rounding=ROUND_HALF_UP))\n",
    "import decimal\n\n\ndef round_cents(amount):\n    # keep exact decimal semantics; floats are converted via str()\n    d = decimal.Decimal(str(amount)) * decimal.Decimal(100)\n    return int(d.quantize(decimal.Decimal('1'), rounding=decimal.ROUND_HALF_UP))\n",
]
BADV = [
    "from decimal import ROUND_HALF_EVEN, Decimal\n\n\ndef round_cents(amount):\n    \"\"\"Dollars (float or str) -> integer cents.\"\"\"\n    return int(Decimal(str(amount)).scaleb(2).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))\n",
    "import decimal\n\n\ndef round_cents(amount):\n    d = decimal.Decimal(str(amount)) * decimal.Decimal(100)\n    return int(d.quantize(decimal.Decimal('1')))\n",
    "from decimal import Decimal\n\n\ndef round_cents(amount):\n    cents = Decimal(str(amount)) * 100\n    return int(cents.to_integral_value())\n",
]
CHECK = "import sys\nfrom pricing import round_cents\n\ncases = {0.125: 13, 2.675: 268, 1.005: 101, 3.14159: 314, 10: 1000}\nbad = {k: round_cents(k) for k in cases if round_cents(k) != cases[k]}\nif bad:\n    print('FAIL', bad)\n    sys.exit(1)\nprint('ok')\n"

env = dict(os.environ)
t = 1704067200

def git(*a):
    subprocess.run(["git", *a], cwd=REPO, env=env, check=True, capture_output=True)

REPO.mkdir(parents=True)
git("init", "-q", "-b", "main")
git("config", "gc.auto", "0")
files = [f"notes/area_{i:02d}.txt" for i in range(40)]
for f in files:
    (REPO / f).parent.mkdir(parents=True, exist_ok=True)
    (REPO / f).write_text(f"{f}\n")
(REPO / "pricing.py").write_text(GOOD[0])
(REPO / "check.py").write_text(CHECK)
(REPO / "README.md").write_text("# pricing\n\nRun `python3 check.py` to test rounding.\n")
verbs = ["tweak", "refine", "update", "tidy", "adjust", "polish", "rework", "clarify"]
for i in range(1, N + 1):
    t += r.randint(300, 7200)
    env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{t} +0000"
    if i == 1:
        git("add", "-A")
        git("commit", "-q", "-m", "Initial pricing module")
        git("tag", "v1.0")
        continue
    if i == BAD:
        (REPO / "pricing.py").write_text(BADV[0])
        msg = "Refactor pricing helper"
    elif i % 97 == 0:
        (REPO / "pricing.py").write_text((BADV if i > BAD else GOOD)[(i // 97) % 3] + f"\n# revision {i}\n")
        msg = "Refactor pricing helper"
    else:
        f = r.choice(files)
        with open(REPO / f, "a") as fh:
            fh.write(f"{r.choice(verbs)} {r.getrandbits(32):08x}\n")
        msg = f"{r.choice(verbs).capitalize()} {f.split('/')[1][:-4].replace('_', ' ')} notes"
    git("commit", "-q", "-a", "-m", msg)
git("gc", "-q")
