import json, math
from pathlib import Path

def test_parameters():
    p = json.loads(Path("/app/fit.json").read_text())
    assert abs(float(p["a"]) - 3.7) < 0.02
    assert abs(float(p["b"]) - 0.83) < 0.01
    assert abs(float(p["c"]) - 1.25) < 0.02

def test_fit_quality():
    p = {k: float(v) for k, v in json.loads(Path("/app/fit.json").read_text()).items()}
    rows = [tuple(map(float, ln.split(","))) for ln in Path("/app/measurements.csv").read_text().split()[1:]]
    rmse = math.sqrt(sum((y - (p["a"] * math.exp(-p["b"] * t) + p["c"])) ** 2 for t, y in rows) / len(rows))
    assert rmse < 0.0115
