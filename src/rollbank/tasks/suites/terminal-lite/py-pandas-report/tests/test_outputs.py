import csv, io, os, random, shutil, stat, subprocess, tempfile
from collections import defaultdict
from decimal import Decimal

# The agent's script runs in a child process as nobody, never as root here: code under test
# cannot write /logs/verifier or signal this runner, so it cannot forge the reward.

def reference():
    r = random.Random(2718)
    agg = defaultdict(lambda: [0, Decimal(0)])
    for i in range(1, 40001):
        date = f"2024-{r.randint(1, 9):02d}-{r.randint(1, 28):02d}"
        region = r.choice(['emea', 'apac', 'amer', 'latam'])
        status = r.choice(['completed', 'completed', 'completed', 'cancelled', 'pending'])
        amount = Decimal(f"{r.randint(100, 500000) / 100:.2f}")
        if status == "completed":
            a = agg[(region, date[:7])]
            a[0] += 1
            a[1] += amount
    return sorted((k[0], k[1], v[0], v[1]) for k, v in agg.items())

def fresh_out_dir():
    """A new, empty /app/out owned by nobody (whatever the agent left there is removed, never
    followed); returns an fd on it, so the output is read from this very directory."""
    out = "/app/out"
    if os.path.islink(out) or (os.path.lexists(out) and not os.path.isdir(out)):
        os.unlink(out)
    elif os.path.isdir(out):
        shutil.rmtree(out)
    os.mkdir(out, 0o755)
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    os.fchown(fd, 65534, 65534)
    return fd

def read_output(dir_fd):
    fd = os.open("report.csv", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        assert stat.S_ISREG(os.fstat(f.fileno()).st_mode), "report.csv is not a regular file"
        return f.read(10_000_000).decode()

def test_rerun_output():
    dir_fd = fresh_out_dir()
    home = tempfile.mkdtemp()
    os.chown(home, 65534, 65534)
    r = subprocess.run(["/opt/venv/bin/python", "/app/report.py"],
                       user=65534, group=65534, extra_groups=[], cwd=home,
                       env={"PATH": "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin", "HOME": home},
                       capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.reader(io.StringIO(read_output(dir_fd), newline="")))
    os.close(dir_fd)
    assert rows[0] == ["region", "month", "orders", "revenue", "avg_order"]
    ref = reference()
    assert len(rows) - 1 == len(ref) == 36
    for row, (reg, month, n, rev) in zip(rows[1:], ref):
        assert row[:3] == [reg, month, str(n)], (row, reg, month, n)
        assert abs(Decimal(row[3]) - rev) <= Decimal("0.01"), (row, rev)
        assert abs(Decimal(row[4]) - rev / n) <= Decimal("0.011"), (row, rev / n)
