from gitlib import *
init()
commit("Initial", app_DOT_py="def rows():\n    return [(1, 'a'), (2, 'b')]\n")
commit("Add README", README_DOT_md="# app\n")
git("checkout", "-q", "-b", "feature/csv")
commit("wip", export_DOT_py="import csv\n")
commit("wip 2", export_DOT_py="import csv, sys\n\n\ndef export(rows, out=sys.stdout):\n    csv.writer(out).writerows(rows)\n")
commit("wip: tests", test_export_DOT_py="import io\nfrom export import export\n\n\ndef test_export():\n    b = io.StringIO()\n    export([(1, 'a')], b)\n    assert b.getvalue() == '1,a\\r\\n'\n")
commit("wip fix", export_DOT_py="import csv\nimport sys\n\n\ndef export(rows, out=sys.stdout):\n    csv.writer(out).writerows(rows)\n")
