from pathlib import Path

def test_join():
    lines = [ln.strip() for ln in Path("/app/joined.csv").read_text().strip().splitlines()]
    assert lines == ["name,dept_name", "Avery,Research", "Blake,Platform", "Casey,Support",
                     "Dakota,Research", "Harper,Data", "Jordan,Platform", "Quinn,Data", "Riley,Research"]
