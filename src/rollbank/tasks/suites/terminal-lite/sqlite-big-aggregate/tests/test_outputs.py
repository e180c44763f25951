from pathlib import Path

def test_table():
    lines = [ln.strip().replace('"', '') for ln in Path("/app/march_by_plan.csv").read_text().strip().splitlines()]
    assert lines == ["plan,events,active_users,net_revenue_cents",
                     "free,128829,25047,62216890", "pro,63548,12447,31987353", "team,62630,12216,30799358"]
