from pathlib import Path

def test_renamed():
    assert not Path("/app/report_draft.md").exists()
    final = Path("/app/report_final.md")
    assert final.is_file()
    assert "Rollouts collected: 48213" in final.read_text()
