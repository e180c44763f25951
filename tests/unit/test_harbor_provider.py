"""The Harbor provider's pure parts: exec translation, results, network modes, tree merge.

Harbor itself is not needed (these modules never import it); the provider end to end under
``harbor run`` is tests/integration/test_harbor_run_real.py.
"""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

from rollbank.errors import InputError
from rollbank.integrations.harbor.commands import (
    CommandTimeout,
    command_argv,
    harbor_result,
    is_root,
    merge_tree,
    network_enabled,
)
from rollbank.integrations.harbor.config import HarborProviderConfig
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.model import Task


def test_root_users_run_directly_under_bash() -> None:
    for user in (None, "root", 0, "0"):
        assert is_root(user)
        assert command_argv("echo hi", user) == ["/bin/bash", "-c", "echo hi"]


def test_other_users_go_through_the_user_switch_with_their_passwd_entry() -> None:
    argv = command_argv("id -un", "agent")
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[3:] == ["sh", "agent", "/bin/bash", "-c", "id -un"]
    assert "setpriv --reuid" in argv[2] and "/etc/passwd" in argv[2]
    assert command_argv("true", 1000)[4] == "1000"  # a uid is looked up the same way


def test_user_switch_script_refuses_an_unknown_user_instead_of_running_as_root() -> None:
    # the wrapper runs on the host's /bin/sh here: an unknown user exits 126, never runs it
    argv = command_argv("echo ran", "no-such-user-rollbank")
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert p.returncode == 126
    assert "ran" not in p.stdout
    assert "not in /etc/passwd" in p.stderr


def _res(**kw: object) -> ExecResult:
    base: dict[str, object] = {"exit_code": 0, "signal": None, "stdout": "o", "stderr": "e",
                               "duration_s": 0.1}
    base.update(kw)
    return ExecResult(**base)  # type: ignore[arg-type]


def test_results_keep_exit_codes_and_map_signals_like_a_shell() -> None:
    assert harbor_result(_res(exit_code=3), timeout_sec=None).return_code == 3
    r = harbor_result(_res(exit_code=None, signal=9), timeout_sec=None)
    assert (r.return_code, r.stdout, r.stderr) == (137, "o", "e")


def test_a_timed_out_command_raises_as_in_harbors_docker_environment() -> None:
    with pytest.raises(CommandTimeout, match="timed out after 5 seconds"):
        harbor_result(_res(exit_code=None, timed_out=True), timeout_sec=5)
    assert issubclass(CommandTimeout, RuntimeError)
    with pytest.raises(RuntimeError, match="host stalled"):
        harbor_result(_res(exit_code=None, host_stalled=True), timeout_sec=5)


def test_network_modes() -> None:
    assert network_enabled("public") is True
    assert network_enabled("no-network") is False
    with pytest.raises(ValueError, match="allowlist"):
        network_enabled("allowlist")


def test_merge_tree_keeps_other_files_and_replaces_same_names(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "reward.txt").write_text("1")
    (src / "sub" / "a").write_text("new")
    (dst / "sub").mkdir(parents=True)
    (dst / "sub" / "a").write_text("old")
    (dst / "keep").write_text("k")
    merge_tree(src, dst)
    assert (dst / "reward.txt").read_text() == "1"
    assert (dst / "sub" / "a").read_text() == "new"
    assert (dst / "keep").read_text() == "k"


def test_config_takes_harbors_string_kwargs_and_refuses_unknown_keys() -> None:
    cfg = HarborProviderConfig.model_validate({"pin_verifier": "false", "max_storage_mb": "512"})
    assert cfg.pin_verifier is False and cfg.max_storage_mb == 512
    with pytest.raises(ValueError):
        HarborProviderConfig.model_validate({"no_such_key": 1})


def test_package_resolves_the_environment_lazily() -> None:
    pkg = importlib.import_module("rollbank.integrations.harbor")
    with pytest.raises(AttributeError):
        _ = pkg.NoSuchThing
    try:
        import harbor  # noqa: F401
    except ImportError:  # the 3.11 venv: the class needs Harbor, the pure parts do not
        with pytest.raises(ImportError):
            _ = pkg.RollbankEnvironment
    else:
        assert pkg.RollbankEnvironment.type() == "rollbank"


def test_separate_verifier_environment_is_its_own_build(tmp_path: Path) -> None:
    from rollbank.integrations.harbor.plane import environment_variant, task_dir_of
    from rollbank.tasks.loader import load_task

    task = tmp_path / "t"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\nenvironment_mode = "separate"\n')
    (task / "instruction.md").write_text("do it\n")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    (task / "tests" / "Dockerfile").write_text("FROM debian:bookworm\nRUN true\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text("true\n")
    assert task_dir_of(task / "environment") == task
    assert task_dir_of(task / "tests") == task
    with pytest.raises(InputError, match=r"no task\.toml"):
        task_dir_of(tmp_path)
    t = load_task(task)
    v = environment_variant(t, task / "tests")
    assert v.dockerfile == task / "tests" / "Dockerfile"
    assert v.context_dir == task / "tests"
    assert v.content_hash != t.content_hash and v.task_id == "t@tests"


def _image_task(image: str) -> Task:
    import dataclasses

    from rollbank.tasks.loader import load_task

    src = Path(__file__).parents[1] / "fixtures" / "tasks" / "harbor-dockerfile-features"
    return dataclasses.replace(load_task(src), dockerfile=None, docker_image=image)


def test_a_docker_image_task_is_accepted_when_a_configured_registry_serves_it() -> None:
    from rollbank.integrations.harbor.plane import HarborPlane, check_pullable
    from rollbank.tasks.config import BuilderConfig

    check_pullable(_image_task("127.0.0.1:5000/org/img:1"), BuilderConfig())
    check_pullable(_image_task("ubuntu:24.04"), BuilderConfig(hub_mirror="127.0.0.1:5000"))
    cfg = HarborProviderConfig.model_validate({"registries": "reg.example:5000, 127.0.0.1",
                                               "hub_mirror": "127.0.0.1:5001"})
    assert cfg.registries == ["reg.example:5000", "127.0.0.1"]
    builder = HarborPlane(cfg).builder_config
    assert builder.registries == ["reg.example:5000", "127.0.0.1"]
    assert builder.hub_mirror == "127.0.0.1:5001"
    check_pullable(_image_task("reg.example:5000/x@sha256:" + "0" * 64), builder)


def test_a_docker_image_task_no_registry_serves_is_refused_naming_task_and_reference() -> None:
    from rollbank.integrations.harbor.plane import check_pullable
    from rollbank.tasks.config import BuilderConfig

    task = _image_task("ubuntu:24.04")
    for cfg in (BuilderConfig(), BuilderConfig(hub_mirror="127.0.0.1:5000", pull=False)):
        with pytest.raises(InputError) as err:
            check_pullable(task, cfg)
        assert task.task_id in str(err.value) and "ubuntu:24.04" in str(err.value)
    with pytest.raises(InputError, match=r"ghcr\.io/org/img:2"):
        check_pullable(_image_task("ghcr.io/org/img:2"), BuilderConfig())
