from pathlib import Path

def test_backup_identical():
    orig = Path("/app/src/settings.ini")
    bak = Path("/app/backup/settings.ini")
    assert orig.is_file(), "original was removed"
    assert bak.is_file(), "backup missing"
    assert bak.read_bytes() == orig.read_bytes()
    assert b"retention_days = 14" in bak.read_bytes()
