from pathlib import Path

def test_only_yaml():
    files = sorted(str(p.relative_to("/app/restored")) for p in Path("/app/restored").rglob("*") if p.is_file())
    assert files == ["config/app.yaml", "config/cache.yaml", "config/db.yaml"]

def test_content():
    assert Path("/app/restored/config/cache.yaml").read_text() == "name: cache\nreplicas: 5\n"
    assert Path("/app/restored/config/db.yaml").read_text() == "name: db\nreplicas: 2\n"
