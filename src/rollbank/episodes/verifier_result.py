"""What every verifier run shares: the protocol's paths, the result, its classification.

Owns :class:`VerifierResult`, :class:`VerifierStatus` and :func:`classify` (pure: what the
test command did and which reward files it left -> a status), the reward parsers, the paths
of the verifier protocol (``/logs/verifier/reward.txt`` ...) and the toolchain pins. Used by
both ways of running a verifier: :mod:`rollbank.episodes.verifier` (through the Sandbox
API) and :mod:`rollbank.episodes.verifier_pinned` (one pinned command); see
:mod:`rollbank.episodes.verifier` for the sequence and the classification rules.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from rollbank.sandbox.protocol import ExecResult

REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"
#: Written by the offline shims when a verifier dependency cannot be installed offline.
SHIM_ERROR = "/logs/verifier/rollbank-shim-error.txt"
OUTPUT_LIMIT = 256 * 1024
PASS_EPS = 1e-9
#: Kill every process of the sandbox but its pid 1, the sandbox's anchor (``sleep infinity``)
#: and this shell: what the agent left running must not touch the verifier's files.
KILL_LEFTOVERS = (
    'for d in /proc/[0-9]*; do p="${d#/proc/}"; [ "$p" = 1 ] || [ "$p" = "$$" ] && continue; '
    'c="$(tr "\\0" " " < "$d/cmdline" 2>/dev/null)"; '
    'case "$c" in "sleep infinity "|"/bin/sleep infinity ") continue;; esac; '
    'kill -9 "$p" 2>/dev/null; done; '
)
#: Paths the verifier always takes from the task's pristine layers (globs allowed), on top of
#: the assembled root's own rule (``sandbox/local/csrc/pins.c``: ``/`` is new, its merged-usr
#: links are the pristine ones) and of every directory the command's environment names as a
#: toolchain (PATH, PYTHONPATH...: ``sandbox/local/runtime.env_pins``): ``/usr`` (interpreters,
#: test runners, shells, libraries, ``/usr/local``), and what steers them from elsewhere: the
#: dynamic loader's files, alternatives, Python's and Perl's system config, the system shell
#: start-up files, OpenSSL's config (it can load modules), PAM and sudo (they load modules),
#: git's and pip's system config, and the user-level install prefixes of root (``pip
#: --user``, uv and cargo install there). A path the pristine layers lack is hidden if the
#: agent created it.
TOOLCHAIN_PINS = ("/usr", "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf",
                  "/etc/ld.so.conf.d", "/etc/ld.so.preload", "/etc/python3*", "/etc/perl",
                  "/etc/environment", "/etc/profile", "/etc/profile.d", "/etc/bash.bashrc",
                  "/etc/ssl/openssl.cnf", "/etc/pam.d", "/etc/pam.conf", "/etc/security",
                  "/etc/sudo.conf", "/etc/gitconfig", "/etc/pip.conf", "/root/.local",
                  "/root/.cargo", "/root/.npmrc", "/root/.config/pip", "/root/.pip")
#: The verifier's default environment (the task's verifier env is applied on top).
VERIFIER_ENV = {"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


class VerifierStatus(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    CRASH = "crash"
    TIMEOUT = "timeout"
    NO_REWARD = "no_reward"
    HOST_STALLED = "host_stalled"  # the host stalled it beyond max_host_stall_s (billing)


@dataclass(frozen=True)
class VerifierResult:
    status: VerifierStatus
    reward: float | None
    rewards: dict[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    signal: int | None = None
    duration_s: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""
    error: str | None = None
    pinned: bool = False  # the test command ran on the pristine toolchain (TOOLCHAIN_PINS)

    @property
    def passed(self) -> bool:
        return self.status is VerifierStatus.PASS


def parse_reward_txt(text: str) -> float:
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(f"reward is not finite: {text.strip()!r}")
    return value


def parse_reward_json(text: str) -> dict[str, float]:
    data = json.loads(text)
    if isinstance(data, int | float) and not isinstance(data, bool):
        data = {"reward": data}
    if not isinstance(data, dict) or not data:
        raise ValueError("reward.json must be a non-empty object of named numbers")
    out: dict[str, float] = {}
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"reward.json entry {k!r} is not a finite number: {v!r}")
        out[str(k)] = float(v)
    return out


def classify(exec_result: ExecResult, reward_txt: str | None, reward_json: str | None) -> VerifierResult:
    """Pure classification of what the test command did and which reward files it left."""
    base: dict[str, Any] = {"exit_code": exec_result.exit_code, "signal": exec_result.signal,
                            "duration_s": exec_result.duration_s,
                            "stdout_tail": exec_result.stdout[-4000:],
                            "stderr_tail": exec_result.stderr[-4000:]}
    if exec_result.host_stalled:  # measured by billing: the host's doing, not a timeout
        return VerifierResult(VerifierStatus.HOST_STALLED, None,
                              error="the host stalled the verifier beyond max_host_stall_s", **base)
    if exec_result.timed_out or exec_result.budget_exhausted:
        return VerifierResult(VerifierStatus.TIMEOUT, None, error="verifier timed out", **base)
    try:
        if reward_txt is not None:
            reward = parse_reward_txt(reward_txt)
            rewards = {"reward": reward}
            passed = reward >= 1.0 - PASS_EPS
        elif reward_json is not None:
            rewards = parse_reward_json(reward_json)
            reward = sum(rewards.values()) / len(rewards)
            passed = all(v >= 1.0 - PASS_EPS for v in rewards.values())
        else:
            if exec_result.exit_code != 0:
                return VerifierResult(VerifierStatus.CRASH, None,
                                      error=f"test command failed (exit {exec_result.exit_code}, "
                                            f"signal {exec_result.signal}) without writing a reward",
                                      **base)
            return VerifierResult(VerifierStatus.NO_REWARD, None,
                                  error="no /logs/verifier/reward.txt or reward.json", **base)
    except ValueError as exc:
        return VerifierResult(VerifierStatus.CRASH, None, error=f"malformed reward: {exc}", **base)
    status = VerifierStatus.PASS if passed else VerifierStatus.FAIL
    return VerifierResult(status, reward, rewards, **base)


def test_files(root: Path) -> list[tuple[str, Path]]:
    """The files under ``root`` (a task's ``tests/``), relative posix path and host path."""
    if not root.is_dir():
        return []
    return [(p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*")) if p.is_file()]


def shim_crash(res: ExecResult, shim_error: str) -> VerifierResult:
    """A shim recorded a dependency it could not install offline: a verifier crash."""
    return VerifierResult(VerifierStatus.CRASH, None, exit_code=res.exit_code, signal=res.signal,
                          duration_s=res.duration_s, stdout_tail=res.stdout[-4000:],
                          stderr_tail=res.stderr[-4000:], error=shim_error.strip()[:2000])

