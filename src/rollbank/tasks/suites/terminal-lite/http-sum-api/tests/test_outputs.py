import json, urllib.error, urllib.request
import pytest

def get(path):
    try:
        r = urllib.request.urlopen("http://127.0.0.1:8081" + path, timeout=5)
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def test_health_ok():
    code, body = get("/health")
    assert code == 200 and body.strip() == "ok"

@pytest.mark.parametrize("a,b", [(1, 2), (-40, 17), (123456789, 987654321), (0, 0)])
def test_sum_values(a, b):
    code, body = get(f"/sum?a={a}&b={b}")
    assert code == 200
    assert json.loads(body) == {"sum": a + b}

@pytest.mark.parametrize("q", ["/sum?a=1", "/sum?a=x&b=2", "/sum", "/sum?a=1.5&b=2"])
def test_errors_bad_input(q):
    code, body = get(q)
    assert code == 400
    assert "error" in json.loads(body)

def test_errors_not_found():
    assert get("/nope")[0] == 404
