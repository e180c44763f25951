"""The image's USER switch (``sandbox/local/user.py``): root is no switch; unknown names and
groups fail the command instead of running it as root (run on the host's /bin/sh)."""

from __future__ import annotations

import subprocess

from rollbank.sandbox.local.user import as_user, is_root


def test_root_forms_are_no_switch() -> None:
    for user in (None, "", "root", "0", "0:0", "root:root", " root "):
        assert is_root(user)
        assert as_user(user, ["id", "-u"]) == ["id", "-u"]
    assert not is_root("app") and not is_root("1000:1000")


def test_a_user_goes_through_the_passwd_lookup_and_setpriv() -> None:
    argv = as_user("app:staff", ["/bin/sh", "-c", "id"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["sh", "app:staff", "/bin/sh", "-c", "id"]
    assert "setpriv --reuid" in argv[2]


def _run(user: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(as_user(user, ["echo", "ran"]), capture_output=True, text=True,
                          check=False)


def test_an_unknown_user_name_or_group_fails_126_and_never_runs() -> None:
    p = _run("no-such-user-rollbank")
    assert (p.returncode, p.stdout) == (126, "") and "not in /etc/passwd" in p.stderr
    p = _run("root:no-such-group-rollbank")
    assert (p.returncode, p.stdout) == (126, "") and "not in /etc/group" in p.stderr
