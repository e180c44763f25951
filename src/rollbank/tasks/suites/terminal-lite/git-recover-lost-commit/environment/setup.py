from gitlib import *
init()
commit("Initial scheduler", scheduler_DOT_py="def schedule(jobs):\n    return sorted(jobs)\n", README_DOT_md="# sched\n")
commit("Add priorities", scheduler_DOT_py="def schedule(jobs):\n    return sorted(jobs, key=lambda j: -j[1])\n")
commit("Document usage", README_DOT_md="# sched\n\nCall schedule(jobs).\n")
commit("Add retry budget to scheduler", scheduler_DOT_py="RETRY_BUDGET = 3\n\n\ndef schedule(jobs):\n    return sorted(jobs, key=lambda j: -j[1])\n\n\ndef may_retry(attempts):\n    return attempts < RETRY_BUDGET\n")
git("reset", "-q", "--hard", "HEAD~1")
commit_msgs = git("log", "--format=%s")
assert "retry budget" not in commit_msgs
