from gitlib import *
PAG = "def paginate(items, page, size):\n    start = page * size\n    return items[start:start + size {op}]\n"
init()
commit("Initial", pager_DOT_py=PAG.format(op="- 1"), VERSION="1.3.0\n", CHANGELOG_DOT_md="# Changelog\n")
git("branch", "hotfix")
commit("Add search module", search_DOT_py="def search(items, q):\n    return [i for i in items if q in i]\n")
commit("Release 2.0.0", VERSION="2.0.0\n", CHANGELOG_DOT_md="# Changelog\n\n## 2.0.0\n- search\n")
git("checkout", "-q", "hotfix")
commit("Bump version to 1.3.1", VERSION="1.3.1\n")
commit("Fix off-by-one in paginate", pager_DOT_py=PAG.format(op=""))
commit("Changelog for 1.3.1", CHANGELOG_DOT_md="# Changelog\n\n## 1.3.1\n- paginate fix\n")
git("checkout", "-q", "main")
