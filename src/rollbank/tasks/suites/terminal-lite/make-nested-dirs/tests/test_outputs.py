from pathlib import Path

def test_dirs_exist():
    assert Path("/app/data/raw/2024/q3").is_dir()
    assert Path("/app/data/processed").is_dir()
