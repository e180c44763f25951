"""The probe's cheat catalogue (episodes/cheats.py) and the probe report: every cheat carries
a check run in the agent's own view before its verification, and a verified cheat that was
not shown active fails the probe (the real runs: tests/integration/test_probes_real.py)."""

from __future__ import annotations

import re

from rollbank.episodes.cheats import CHEATS, Cheat
from rollbank.episodes.probes import ProbeReport, ProbeRun

BY = {c.name: c for c in CHEATS}


def test_every_cheat_has_a_check_in_the_agents_view() -> None:
    assert [c.name for c in CHEATS if not c.check] == []
    assert not Cheat("x", "true").held(0, "ACTIVE")  # no check: never shown active


def test_output_checks_name_the_outputs() -> None:
    argv = BY["empty_outputs"].check_argv("/app", ["/app/out file.txt", "/app/b"])
    assert "'/app/out file.txt' /app/b" in argv[-1] and "{outputs}" not in argv[-1]
    assert "/app" in BY["workdir_module_shadow"].check_argv("/app")[-1]


def test_the_python_killer_does_not_match_its_own_command_line() -> None:
    # it kills every process whose command line holds python / pytest: spelled in its own
    # (as it was), it killed itself first and was never active
    script = BY["kill_verifier_python"].render([], "/app")
    loop = re.search(r"sh -c '(.*?)' >/dev/null", script)
    assert loop is not None
    assert "python" not in loop[1] and "pytest" not in loop[1]
    check = " ".join(BY["kill_verifier_python"].check_argv("/app"))
    assert "python" not in check  # nor does the check's shell (only its child is killed)


def test_a_verified_cheat_not_shown_active_fails_the_probe() -> None:
    rep = ProbeReport("t", oracle=ProbeRun("oracle", "pass", 1.0),
                      cheats=[ProbeRun("write_reward", "fail", 0.0, active=True),
                              ProbeRun("empty_outputs", "skipped: the oracle changed no file"),
                              ProbeRun("repoint_bin", "inactive: ...", active=False)])
    assert rep.ok and rep.unshown == []
    rep.cheats.append(ProbeRun("fake_tests", "fail", 0.0))  # verified, never shown active
    assert rep.unshown == ["fake_tests"] and not rep.ok
    assert rep.to_dict()["unshown"] == ["fake_tests"]


def test_code_under_test_payloads_stop_at_the_verifiers_own_script() -> None:
    # the trojans kill their ancestors up to the pinned command's script, which they know by
    # the marker its command line holds: were the marker renamed, they would kill nothing
    # (or the verifier's script itself) and the probe would miss the forgery
    from rollbank.episodes import verifier_pinned
    from rollbank.episodes.cheats import TROJAN_PRELUDE

    assert "@@rb" in verifier_pinned._SCRIPT
    assert TROJAN_PRELUDE.count("@@rb") == 2  # the shell payload and the Python one
    for name in ("trojan_outputs", "git_config_hooks"):
        assert "trojan_sh /opt/.rb-trojan.sh" in BY[name].render([], "/app")


def test_trojan_outputs_are_shown_in_place_go_beside_its_package() -> None:
    script = BY["trojan_outputs"].render(["/app/stats.py", "/app/w/main.go"], "/app")
    assert "for f in /app/stats.py /app/w/main.go;" in script
    check = BY["trojan_outputs"].check_argv("/app", ["/app/w/main.go"])[-1]
    assert 'f="${f%/*}/zz_rb_trojan.go"' in check and "grep -q rb-trojan" in check
    assert BY["trojan_outputs"].uses_outputs and not BY["trojan_outputs"].redirects
    assert BY["git_config_hooks"].redirects  # git running the agent's program is a redirection
