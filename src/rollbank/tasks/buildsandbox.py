"""The build sandbox: run one Dockerfile step over read-only layers, capturing its writes.

Owns: the only place where build steps execute. A step runs as real root (as in
``docker build``) inside ``unshare --mount --propagation private``, where an overlayfs is
mounted (read-only lower layers + an empty upper directory), then ``bwrap`` enters it with the
merged tree as ``/``, a fresh ``/dev`` and ``/proc``, its own PID/IPC/UTS namespaces, Docker's
default capability set (:data:`DOCKER_CAPS`, not all of root's), the host network (build steps may reach the package registries) and the host ``/etc/resolv.conf``
bound read-only. The upper directory, afterwards, *is* the new layer (whiteouts included).

Invariants
- The environment is clean (``--clearenv``): only what the caller passes; host variables never
  leak in.
- The overlay mount lives only in the step's private mount namespace: when the step ends (or
  is killed) the kernel drops it — nothing to unmount, nothing leaks.
- A timeout kills the whole process group with SIGKILL; bwrap's ``--die-with-parent`` and the
  PID namespace take every process of the step with it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rollbank.errors import BuildError
from rollbank.tasks.shims import BUILD_SHIM_DIR

RESOLV = Path("/etc/resolv.conf")
#: The host's CA bundle (its egress proxy's CA included), bound read-only into every build step
#: under /dev (a tmpfs of the step: the mount point never reaches a layer) and named by the
#: variables below, so registries are reachable whatever the image's own trust store holds —
#: without installing anything into the task's package state.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
STEP_CA = "/dev/rollbank-ca.crt"
CA_VARS = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
           "NODE_EXTRA_CA_CERTS", "CARGO_HTTP_CAINFO", "npm_config_cafile")
#: Docker's default capability set: what `docker build` grants RUN steps. Not ALL: a step runs
#: as the host's real root and must not load modules, mount, or change host-wide sysctls.
DOCKER_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
               "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
               "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")


@dataclass(frozen=True)
class StepResult:
    exit_code: int | None
    timed_out: bool
    duration_s: float
    log_tail: str


def check_tools() -> None:
    for tool in ("unshare", "bwrap", "mount"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} is not installed (scripts/setup.sh installs it)")
    if os.geteuid() != 0:
        raise BuildError("building environments needs root (overlayfs mounts)")


def run_step(
    *,
    lowers: Sequence[Path],
    scratch: Path,
    argv: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    timeout_s: float,
    binds: Sequence[tuple[Path, str]] = (),
    network: bool = True,
    shims: Path | None = None,
    log: Path,
    stages: Sequence[tuple[Sequence[Path], str]] = (),
) -> StepResult:
    """Run ``argv`` over ``lowers`` (lowest first); writes land in ``scratch/upper``.

    ``binds`` are host directories bound read-only under ``/run`` (which is a tmpfs for the
    step when binds are given, so the mount points never reach the layer). ``shims`` is bound
    at :data:`~rollbank.tasks.shims.BUILD_SHIM_DIR` and put first on PATH (not part of the
    layer key: it changes how the registries are reached, not what is asked for).
    ``stages`` are earlier build stages (their layers, lowest first) mounted read-only at the
    given path (under ``/run``) for ``COPY --from``.
    """
    check_tools()
    upper, work, merged = scratch / "upper", scratch / "work", scratch / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    base = scratch.parent
    lowerdir = ":".join(os.path.relpath(p, base) for p in reversed(list(lowers)))
    opts = (f"lowerdir={lowerdir},upperdir={os.path.relpath(upper, base)},"
            f"workdir={os.path.relpath(work, base)},redirect_dir=off,metacopy=off")
    if len(opts) > 3800:
        raise BuildError(f"too many layers for one overlay mount ({len(lowers)})")
    bwrap = ["bwrap", "--bind", str(merged), "/", "--dev", "/dev", "--proc", "/proc",
             "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "rollbank-build",
             "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for cap in DOCKER_CAPS:
        bwrap += ["--cap-add", cap]
    if not network:
        bwrap.append("--unshare-net")
    env = dict(env)
    if shims is not None:
        bwrap += ["--ro-bind", str(shims), BUILD_SHIM_DIR]
        env["PATH"] = f"{BUILD_SHIM_DIR}:{env.get('PATH', '/usr/bin:/bin')}"
        # uv bundles its own CA roots; the registries may sit behind the host's TLS proxy
        # whose CA only the system store (copied into the base) trusts.
        env.setdefault("UV_NATIVE_TLS", "1")
    if RESOLV.exists():
        bwrap += ["--ro-bind", str(RESOLV.resolve()), "/etc/resolv.conf"]
    if network and HOST_CA_BUNDLE.exists():
        bwrap += ["--ro-bind", str(HOST_CA_BUNDLE.resolve()), STEP_CA]
        for var in CA_VARS:
            env.setdefault(var, STEP_CA)
    pre = ""
    if binds or stages:
        bwrap += ["--tmpfs", "/run"]
        for src, dst in binds:
            bwrap += ["--ro-bind", str(src), dst]
        for i, (stage_lowers, dst) in enumerate(stages):
            if len(stage_lowers) == 1:  # overlayfs needs two lower layers without an upper one
                bwrap += ["--ro-bind", str(stage_lowers[0]), dst]
                continue
            mnt = scratch / f"stage{i}"
            mnt.mkdir(parents=True, exist_ok=True)
            lowers_i = ":".join(os.path.relpath(p, base) for p in reversed(list(stage_lowers)))
            pre += (f"mount -t overlay overlay -o {shlex.quote('lowerdir=' + lowers_i)} "
                    f"{shlex.quote(str(mnt))} && ")
            bwrap += ["--ro-bind", str(mnt), dst]
    for k, v in env.items():
        bwrap += ["--setenv", k, v]
    bwrap += ["--chdir", workdir, "--", *argv]
    script = (f"{pre}mount -t overlay overlay -o {shlex.quote(opts)} {shlex.quote(str(merged))} "
              f"&& exec {shlex.join(bwrap)}")
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script]
    start = time.monotonic()
    timed_out = False
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=base, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        try:
            proc.wait(timeout=max(timeout_s, 0.001))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    duration = time.monotonic() - start
    return StepResult(None if timed_out else proc.returncode, timed_out, duration, tail(log))


def tail(log: Path, limit: int = 3000) -> str:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
