from pathlib import Path

NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6,
         "jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6, "jul": 7, "aug": 8,
         "sep": 9, "oct": 10, "nov": 11, "dec": 12}

def expand(field, lo, hi):
    out = set()
    for part in field.lower().split(","):
        rng, _, step = part.partition("/")
        step = int(step) if step else 1
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (int(NAMES.get(x, x)) for x in rng.split("-"))
        else:
            a = int(NAMES.get(rng, rng))
            b = hi if step != 1 else a
        out |= set(range(a, b + 1, step))
    if hi == 7:
        out = {0 if x == 7 else x for x in out}
    return out

def jobs():
    res = {}
    for ln in Path("/app/crontab").read_text().splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("#") or "=" in ln.split()[0]:
            continue
        f = ln.split(None, 5)
        res[f[5].strip()] = (expand(f[0], 0, 59), expand(f[1], 0, 23), f[2], expand(f[3], 1, 12), expand(f[4], 0, 7))
    return res

def test_jobs():
    j = jobs()
    assert set(j) == {"/app/bin/backup.sh", "/app/bin/report.sh", "/app/bin/ping.sh"}
    allm, allh, alld = set(range(60)), set(range(24)), set(range(7))
    assert j["/app/bin/backup.sh"] == ({30}, {2}, "*", set(range(1, 13)), alld)
    assert j["/app/bin/report.sh"] == ({0}, {9}, "*", set(range(1, 13)), {1})
    assert j["/app/bin/ping.sh"] == ({0, 15, 30, 45}, allh, "*", set(range(1, 13)), alld)
