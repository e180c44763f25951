import zipfile

WANT = {"index.html": b"<html>app</html>\n", "js/app.js": b"console.log(1)\n", "js/vendor/lib.js": b"lib()\n",
        "css/site.css": b"body{}\n", "img/logo.svg": b"x" * 3000, "MAPS.txt": b"map notes\n"}

def test_zip():
    with zipfile.ZipFile("/app/release.zip") as z:
        names = {n for n in z.namelist() if not n.endswith("/")}
        assert names == set(WANT)
        for n, data in WANT.items():
            assert z.read(n) == data
