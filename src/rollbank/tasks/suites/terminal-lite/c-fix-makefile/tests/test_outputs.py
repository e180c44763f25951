import os, shutil, subprocess

def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)

def test_make_builds_from_scratch():
    r = run(["make", "-C", "/app", "clean"])
    assert r.returncode == 0, r.stderr
    assert not os.path.exists("/app/bin/wordstat")
    r = run(["make", "-C", "/app"])
    assert r.returncode == 0, r.stdout + r.stderr
    out = run(["/app/bin/wordstat"], input="hello brave  new\nworld\n\n")
    assert out.stdout.split() == ["3", "4", "24"]

def test_sources_unchanged():
    src = open("/app/src/util.c").read()
    assert "size_t count_chars(const char *s) { return strlen(s); }" in src
    assert "count_words(buf)" in open("/app/src/main.c").read()
