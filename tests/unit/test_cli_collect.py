"""`rollbank collect` flags come from the config models; errors name the flag that gave a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.cli.collect import config_from
from rollbank.cli.main import build_parser, main
from rollbank.errors import UsageError


def _config(*argv: str):  # type: ignore[no-untyped-def]
    return config_from(build_parser().parse_args(["collect", *argv]))


def test_aliases_and_generated_flags_set_the_same_fields() -> None:
    a = _config("--groups", "8", "--group-size", "2")
    b = _config("--scheduler.groups-per-batch", "8", "--scheduler.bank.group-size", "2")
    assert a == b
    assert a.scheduler.groups_per_batch == 8 and a.scheduler.bank.group_size == 2


def test_pool_follows_one_rule_for_flags_and_the_embedded_default() -> None:
    assert _config().scheduler.pool_groups == 6  # embedded default: G = 4 -> ceil(1.5 G)
    assert _config("--groups", "8").scheduler.pool_groups == 12
    assert _config("--groups", "8", "--pool-groups", "9").scheduler.pool_groups == 9


def test_a_bad_value_names_the_flag_not_the_embedded_file() -> None:
    with pytest.raises(UsageError, match="--groups -1: Input should be greater than") as e:
        _config("--groups", "-1")
    assert "embedded" not in str(e.value)


def test_a_cross_field_error_names_the_flags_that_touched_it() -> None:
    with pytest.raises(Exception, match=r"pool_groups \(3\) must be >= groups_per_batch \(8\).*--groups"):
        _config("--groups", "8", "--pool-groups", "3")


def test_set_into_a_value_is_a_usage_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--set", "tasks.x=1"]) == 2
    err = capsys.readouterr().err
    assert "--set tasks.x: 'tasks' is a value" in err and "Traceback" not in err
    assert main(["collect", "--set", "scheduler.nonsense=1"]) == 2


def test_bad_flag_value_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--groups", "-1"]) == 2
    assert "--groups" in capsys.readouterr().err


def test_runner_context_must_fit_the_managed_servers() -> None:
    with pytest.raises(Exception, match=r"runner.max_model_len \(4096\) exceeds.*--runner.max-model-len"):
        _config("--runner.max-model-len", "4096")
    assert _config("--runner.max-model-len", "4096", "--inference.managed.max-model-len", "4096")


def test_resume_of_a_missing_run_is_a_typed_error_naming_the_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"{tmp_path}/absent"
    assert main(["collect", "--resume", missing]) != 0
    err = capsys.readouterr().err
    assert "no such run folder" in err and "absent" in err and "Traceback" not in err


def test_ray_flag_sets_the_sandbox_backend_address() -> None:
    for value in ("auto", "10.0.0.5:6379"):
        assert _config("--ray", value).sandbox.ray.address == value
    assert _config().sandbox.ray.address is None  # the embedded default stays local
