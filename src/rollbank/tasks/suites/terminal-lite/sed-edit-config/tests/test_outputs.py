from pathlib import Path

def test_conf():
    lines = Path("/app/app.conf").read_text().splitlines()
    assert lines == [
        "# Example: port = 1234",
        "# debug = true enables verbose logs",
        "name = rollbank-api",
        "port = 8081",
        "debug = true",
        "report_port = 9100",
        "debug_dir = /var/log/debug",
    ]
