import hashlib
from pathlib import Path

def test_pin():
    pin = Path("/app/pin.txt").read_text().strip()
    assert len(pin) == 4 and pin.isdigit()
    dk = hashlib.pbkdf2_hmac("sha256", pin.encode(), b"rollbank-salt-42", 3000)
    assert dk.hex() == "6a61a2a3c4cfa1bcf060f1b0b33c6a674892cd00890c8e10256dbbff7d1e4f74"
