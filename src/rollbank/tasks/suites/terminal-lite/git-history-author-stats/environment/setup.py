"""Builds /app/repo: a long history written by many authors, with two release tags."""
import os, random, subprocess
from pathlib import Path

REPO = Path("/app/repo")
N = 2500
r = random.Random(777)
AUTHORS = [("Ana Ortiz", "ana@rollbank.dev"), ("Bo Chen", "bo@rollbank.dev"), ("Cy Diaz", "cy@rollbank.dev"),
           ("Dee Park", "dee@rollbank.dev"), ("Eli Novak", "eli@rollbank.dev"), ("Fay Singh", "fay@rollbank.dev"),
           ("Gus Berg", "gus@rollbank.dev"), ("Hal Ito", "hal@rollbank.dev"), ("Ivy Laine", "ivy@contractor.example"),
           ("Jo Moss", "jo@contractor.example"), ("Kai Roy", "kai@rollbank.dev"), ("Lu Varga", "lu@rollbank.dev")]
W = [14, 11, 9, 9, 8, 7, 6, 5, 5, 4, 3, 2]
AREAS = {"src/core": 5, "src/ui": 4, "docs": 2, "tests/core": 2}
env = dict(os.environ)
t = 1672531200

def git(*a):
    subprocess.run(["git", *a], cwd=REPO, env=env, check=True, capture_output=True)

REPO.mkdir(parents=True)
git("init", "-q", "-b", "main")
git("config", "gc.auto", "0")
files = [f"{a}/mod_{i}.txt" for a in AREAS for i in range(8)]
for f in files:
    (REPO / f).parent.mkdir(parents=True, exist_ok=True)
    (REPO / f).write_text(f"{f}\n")
for i in range(1, N + 1):
    t += r.randint(600, 20000)
    name, email = r.choices(AUTHORS, weights=W)[0]
    env.update(GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email, GIT_COMMITTER_NAME=name, GIT_COMMITTER_EMAIL=email,
               GIT_AUTHOR_DATE=f"{t} +0000", GIT_COMMITTER_DATE=f"{t} +0000")
    if i == 1:
        git("add", "-A")
        git("commit", "-q", "-m", "Initial import")
        continue
    area = r.choices(list(AREAS), weights=list(AREAS.values()))[0]
    touched = {r.choice([f for f in files if f.startswith(area)])}
    if r.random() < 0.25:
        touched.add(r.choice(files))
    for f in touched:
        with open(REPO / f, "a") as fh:
            fh.write(f"{r.getrandbits(40):010x}\n")
    msg = f"{area.split('/')[-1]}: change {r.getrandbits(24):06x}"
    if i in (1100, 2000):
        msg = "Release " + ("1.0" if i == 1100 else "2.0")
    git("commit", "-q", "-a", "-m", msg)
    if i == 1100:
        git("tag", "-a", "v1.0", "-m", "v1.0")
    if i == 2000:
        git("tag", "-a", "v2.0", "-m", "v2.0")
git("gc", "-q")
