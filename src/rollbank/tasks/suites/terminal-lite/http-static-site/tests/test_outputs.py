import urllib.error, urllib.request
import pytest

def get(path):
    return urllib.request.urlopen("http://127.0.0.1:8000" + path, timeout=5)

def test_index():
    assert get("/index.html").read().decode().strip() == "<h1>rollbank status: green</h1>"

def test_nested_and_404():
    assert get("/docs/stats.txt").read().decode().strip() == "episodes=128 groups=16"
    with pytest.raises(urllib.error.HTTPError) as e:
        get("/missing.txt")
    assert e.value.code == 404
