import hashlib, lzma, os

def test_compressed():
    assert not os.path.exists("/app/telemetry.csv"), "the original must be removed"
    raw = open("/app/telemetry.csv.xz", "rb").read()
    assert raw[:6] == b"\xfd7zXZ\x00", "not an xz file"
    assert len(raw) < 2_500_000
    data = lzma.decompress(raw)
    assert hashlib.sha256(data).hexdigest() == "fb0e5687083aeb788857fe81df4cb18ae2da2a0cd70b135d5be17254cb21b8dd"
