"""Command lines of the local runtime (pure functions: no process is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.errors import SandboxStartError
from rollbank.sandbox.local.etc_files import FALLBACK_DNS, etc_files, resolv_conf
from rollbank.sandbox.local.runtime import (
    DEFAULT_CAP_MASK,
    PRISTINE_MOUNT,
    IdMapping,
    check_pins,
    env_pins,
    exec_argv,
    expand_pins,
    idmapped_views,
    init_argv,
    mapped_stage,
    outermost,
    overlay_options,
    rlimit_shell,
    rlimit_values,
)


def test_overlay_lowerdir_is_top_first_and_rejects_unsafe_paths(tmp_path: Path) -> None:
    base, task, frozen = (tmp_path / n for n in ("base", "task", "frozen"))
    for d in (base, task, frozen):
        d.mkdir()
    opts = overlay_options([base, task, frozen], "/m/upper", "/m/work")
    assert opts == f"lowerdir={frozen}:{task}:{base},upperdir=/m/upper,workdir=/m/work"
    bad = tmp_path / "a:b"
    bad.mkdir()
    with pytest.raises(SandboxStartError):
        overlay_options([bad], "/u", "/w")
    with pytest.raises(SandboxStartError):
        overlay_options([tmp_path / "missing"], "/u", "/w")
    with pytest.raises(SandboxStartError):
        overlay_options([], "/u", "/w")
    with pytest.raises(SandboxStartError, match="too many"):
        overlay_options([base] * 200, "/u", "/w")


def test_exec_never_opens_the_working_directory_on_the_host() -> None:
    files = [Path("/sys/fs/cgroup/pids/x/cgroup.procs")]
    shell = exec_argv(anchor_pid=42, procs_files=files, rlimits="ulimit -c 0", command="ls",
                      cwd="/app", drop_caps=True)
    assert not any(a.startswith("--wd=") for a in shell)
    script = shell[2]
    assert "-t 42" in script and "setpriv" in script and "cd --" in script
    helper = exec_argv(anchor_pid=42, procs_files=files, rlimits="", command=["ls", "-l"],
                       cwd="/app", drop_caps=True, helper=Path("/h"), rlimit_vals=("64", "1024"))
    assert helper == ["/h", "exec", "42", "/app", "64", "1024", f"{DEFAULT_CAP_MASK:x}", "1",
                      str(files[0]), "--", "ls", "-l"]
    keep_all = exec_argv(anchor_pid=1, procs_files=[], rlimits="", command="true", cwd="/",
                         drop_caps=False, helper=Path("/h"))
    assert keep_all[6] == "0" and keep_all[-3:] == ["/bin/sh", "-c", "true"]


def test_init_isolates_network_unless_allowed(tmp_path: Path) -> None:
    kw = dict(procs_files=[], mount_dir=tmp_path / "mnt", layers=[tmp_path], storage_mb=64,
              rlimits=rlimit_shell(open_files=64, file_size_mb=2), bwrap="/usr/bin/bwrap",
              hostname="sb")
    closed = init_argv(network=False, **kw)  # type: ignore[arg-type]
    opened = init_argv(network=True, **kw)  # type: ignore[arg-type]
    assert "--unshare-net" in closed[-1] and "--unshare-net" not in opened[-1]
    assert "size=64m" in closed[-1] and "ulimit -f 4096" in closed[-1]
    helper = init_argv(network=False, helper=Path("/h"), rlimit_vals=rlimit_values(
        open_files=64, file_size_mb=2), **kw)  # type: ignore[arg-type]
    assert helper[:4] == ["/h", "init", str(tmp_path / "mnt"), "64"]
    assert helper[5] == f"lowerdir={tmp_path}"  # the pristine layers, for pinned commands
    assert helper[6:8] == ["64", str(2 << 20)]
    i = helper.index("--ro-bind", helper.index("/dev"))
    assert helper[i:i + 7] == ["--ro-bind", f"{tmp_path / 'mnt'}/pristine", PRISTINE_MOUNT,
                               "--tmpfs", PRISTINE_MOUNT, "--remount-ro", PRISTINE_MOUNT]
    assert PRISTINE_MOUNT not in closed[-1]  # the shell path has no pristine view
    assert helper[-4:] == ["--as-pid-1", "--", "@ANCHOR@", "anchor"]
    assert "--unshare-user" in helper and "--die-with-parent" in helper


def test_pinned_exec_is_a_helper_vexec_with_its_paths(tmp_path: Path) -> None:
    argv = exec_argv(anchor_pid=7, procs_files=[Path("/cg/x1/cgroup.procs")], rlimits="",
                     command=["pytest"], cwd="/tests", drop_caps=True, helper=Path("/h"),
                     pins=["/usr", "/etc/ld.so.preload"])
    assert argv[:7] == ["/h", "vexec", "7", "/tests", "1024", str(1 << 30), f"{DEFAULT_CAP_MASK:x}"]
    assert argv[7] == "/usr\n/etc/ld.so.preload"
    assert argv[8:] == ["1", "/cg/x1/cgroup.procs", "--", "pytest"]
    with pytest.raises(SandboxStartError, match="rb-helper"):
        exec_argv(anchor_pid=7, procs_files=[], rlimits="", command="true", cwd="/",
                  drop_caps=True, pins=["/usr"])


@pytest.mark.parametrize("bad", ["usr", "/usr/../etc", "/a,b", "/a:b", "/a\nb", "/usr//bin", "/x/."])
def test_pins_are_absolute_normalised_paths(bad: str) -> None:
    with pytest.raises(SandboxStartError):
        check_pins([bad])


def test_pin_globs_expand_against_the_layers(tmp_path: Path) -> None:
    low, high = tmp_path / "low", tmp_path / "high"
    (low / "etc/python3.11").mkdir(parents=True)
    (high / "etc/python3.12").mkdir(parents=True)
    got = expand_pins(["/usr", "/etc/python3*", "/etc/ld.so.preload", "/usr"], [low, high])
    assert got == ["/usr", "/etc/python3.11", "/etc/python3.12", "/etc/ld.so.preload"]


def test_mapped_init_idmaps_the_read_only_layers_but_not_shifted_snapshots(tmp_path: Path) -> None:
    base, frozen, mnt = tmp_path / "base", tmp_path / "snap", tmp_path / "mnt"
    for d in (base, frozen, mnt):
        d.mkdir()
    kw = dict(procs_files=[], mount_dir=mnt, layers=[base, frozen], storage_mb=64, rlimits="",
              bwrap="/usr/bin/bwrap", hostname="h", network=False)
    mapping = IdMapping(100000, 65536, frozenset({frozen}), userns_fd=7)
    argv = init_argv(helper=Path("/h"), mapping=mapping, **kw)  # type: ignore[arg-type]
    stage = mapped_stage(mnt, "/usr/bin/bwrap")
    assert not mnt.is_relative_to(stage)  # the stage never hides the mount dir (snapshots)
    # the overlay and the pristine view use the idmapped view of base, the snapshot as is
    assert argv[4].startswith(f"lowerdir={frozen}:{mnt}/l0,")
    assert argv[5] == f"lowerdir={frozen}:{mnt}/l0"
    assert argv[8] == f"100000 7 {stage}\n{base}\n{mnt}/l0"
    assert argv[argv.index("--bind") + 1] == f"{stage}/root"
    assert argv[argv.index("--ro-bind", argv.index("/dev")) + 1] == f"{stage}/pristine"
    off = init_argv(helper=Path("/h"), **kw)  # type: ignore[arg-type]
    assert off[8] == "-" and off[4].startswith(f"lowerdir={frozen}:{base},")
    assert off[off.index("--bind") + 1] == f"{mnt}/root"
    with pytest.raises(SandboxStartError, match="rb-helper"):  # the shell path cannot map
        init_argv(mapping=mapping, **kw)  # type: ignore[arg-type]
    assert idmapped_views([base], mnt, None) == ([str(base)], "-")


def test_the_mapped_stage_is_never_above_the_mount_dir_or_bwrap(tmp_path: Path) -> None:
    assert mapped_stage(Path("/tmp/x/mnt"), "/usr/bin/bwrap") == "/run"
    assert mapped_stage(Path("/root/.cache/mnt"), "/usr/bin/bwrap") == "/tmp"
    assert mapped_stage(Path("/root/.cache/mnt"), "/tmp/bwrap") == "/run"


def test_env_pins_are_the_toolchain_dirs_of_the_environment_not_the_work(tmp_path: Path) -> None:
    (tmp_path / "opt" / "venv").mkdir(parents=True)
    (tmp_path / "opt" / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    env = {"PATH": "/opt/venv/bin:/app/bin:/usr/local/bin:/bin:relative:/a,b",
           "PYTHONPATH": "/srv/lib/", "HOME": "/root"}
    pins = env_pins(env, [tmp_path], "/app")
    # the venv's root with its bin; the work dir's bin is the agent's work; no unusable paths
    assert pins == ["/opt/venv/bin", "/opt/venv", "/usr/local/bin", "/bin", "/srv/lib"]
    assert outermost(["/usr", "/usr/local/bin", "+/tests", "/bin", "/opt/venv/bin",
                      "/opt/venv", "/usr"]) == ["/usr", "+/tests", "/bin", "/opt/venv"]


def test_resolv_conf_drops_loopback_nameservers_and_falls_back_like_docker() -> None:
    host = "search lan\nnameserver 127.0.0.53\nnameserver 10.0.0.2\noptions edns0\n"
    assert resolv_conf(host) == "search lan\nnameserver 10.0.0.2\noptions edns0\n"
    assert resolv_conf("nameserver 127.0.0.53\n") == FALLBACK_DNS
    files = etc_files("box", host)
    assert files["/etc/hostname"] == b"box\n" and b"127.0.0.1\tlocalhost\n" in files["/etc/hosts"]


def test_init_copies_the_runtime_files_into_the_sandbox(tmp_path: Path) -> None:
    argv = init_argv(procs_files=[], mount_dir=tmp_path, layers=[tmp_path], storage_mb=64,
                     rlimits="", bwrap="/usr/bin/bwrap", hostname="h", network=False,
                     helper=Path("/cache/rb-helper"), files=[(7, "/etc/hosts")])
    at = argv.index("--file")
    assert argv[at - 2: at + 3] == ["--perms", "0644", "--file", "7", "/etc/hosts"]


def test_the_anchor_gets_the_ready_pipe_on_the_helper_path_only(tmp_path: Path) -> None:
    kw = dict(procs_files=[], mount_dir=tmp_path / "mnt", layers=[tmp_path], storage_mb=64,
              rlimits="", bwrap="/usr/bin/bwrap", hostname="sb", network=False)
    helper = init_argv(helper=Path("/h"), ready_fd=9, **kw)  # type: ignore[arg-type]
    assert helper[-5:] == ["--as-pid-1", "--", "@ANCHOR@", "anchor", "9"]
    assert init_argv(helper=Path("/h"), **kw)[-1] == "anchor"  # type: ignore[arg-type]
    shell = init_argv(ready_fd=9, **kw)  # type: ignore[arg-type]
    assert shell[-1].endswith("-- /bin/sleep infinity")  # sleep cannot write it: polled
