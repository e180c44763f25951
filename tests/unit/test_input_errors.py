"""Bad input ends in the documented exit code with a message naming the file/flag, never a
traceback (issue 24, defects 3-5): 2 for the command line, 3 for files and their values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.cli.main import main
from rollbank.collect_config import load_collect_config
from rollbank.collector import check_output_folder
from rollbank.config import read_toml
from rollbank.errors import ConfigError, InputError, UsageError
from rollbank.service.config import ServiceSection, resolve_token

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOOD_TASK = FIXTURES / "tasks" / "harbor-dockerfile-features"
DEEP = 5000


def _stderr(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


# ------------------------------------------------------------------ exit codes (defect 3)
@pytest.mark.parametrize("sub", ["list", "build"])
def test_bad_task_folder_under_tasks_list_and_build_exits_3(
        sub: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = FIXTURES / "tasks-malformed" / "bad-toml"
    assert main(["tasks", sub, str(bad)]) == 3
    assert "bad-toml" in _stderr(capsys)


def test_bad_episode_file_under_replay_exits_3(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ep.json"
    f.write_text('{"schema": "rollbank.episode/1"}')
    assert main(["replay", str(f)]) == 3
    assert str(f) in _stderr(capsys)


def test_empty_part_in_a_dotted_set_key_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--set", "a..b=1"]) == 2
    assert "a..b" in _stderr(capsys)
    with pytest.raises(UsageError):
        load_collect_config(None, {".runner.seed": 1})


# ------------------------------------------------------------------ tracebacks (defect 4)
@pytest.mark.parametrize("content,what", [
    (b"\xff\xfe[runner]\n", "not UTF-8"),
    (b"a = " + b"[" * DEEP + b"]" * DEEP + b"\n", "nested too deeply"),
])
def test_unreadable_config_files_exit_3(tmp_path: Path, content: bytes, what: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "c.toml"
    f.write_bytes(content)
    assert main(["collect", "--config", str(f)]) == 3
    err = _stderr(capsys)
    assert what in err and str(f) in err


def test_config_that_is_a_directory_exits_3(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--config", str(tmp_path)]) == 3
    assert "directory" in _stderr(capsys)
    with pytest.raises(ConfigError, match="directory"):
        read_toml(tmp_path, default_text="", default_name="x")


def test_a_5000_digit_set_integer_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--set", "scheduler.seed=" + "9" * DEEP]) == 2
    err = _stderr(capsys)
    assert "--set scheduler.seed" in err and "digits" in err
    from rollbank.config import parse_flag_value

    assert parse_flag_value("not json", "--x") == "not json"
    assert parse_flag_value("[1, 2]", "--x") == [1, 2]


def test_deeply_nested_episode_json_exits_3(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ep.json"
    f.write_text("[" * DEEP + "]" * DEEP)
    assert main(["replay", str(f)]) == 3
    assert "nested too deeply" in _stderr(capsys)


def test_non_utf8_episode_file_exits_3(tmp_path: Path) -> None:
    f = tmp_path / "ep.json"
    f.write_bytes(b'{"schema": "\xff"}')
    assert main(["replay", str(f)]) == 3


def _episode(tmp_path: Path, **fields: object) -> Path:
    rec = {"schema": "rollbank.episode/1", "trajectory_id": "t0", "group_id": "g0",
           "task_id": "harbor-dockerfile-features", "task_path": str(GOOD_TASK),
           "task_hash": "x", **fields}
    f = tmp_path / "ep.json"
    f.write_text(json.dumps(rec))
    return f


def test_unknown_harness_in_an_episode_file_exits_3(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = _episode(tmp_path, harness="no-such-harness")
    assert main(["replay", str(f)]) == 3
    err = _stderr(capsys)
    assert "no-such-harness" in err and "harness" in err and str(f) in err


def test_non_utf8_token_file_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_bytes(b"\xff" * 32)
    with pytest.raises(ConfigError, match="UTF-8") as exc:
        resolve_token(ServiceSection.model_validate({"token_file": str(f)}), {})
    assert exc.value.field == "service.token_file"


def test_output_folder_that_cannot_be_created_is_refused_before_set_up(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(InputError, match="cannot be created") as exc:
        check_output_folder(blocker / "run")
    assert exc.value.field == "output"
    check_output_folder(tmp_path / "new" / "run")  # creatable: created, no error
    assert (tmp_path / "new" / "run").is_dir()


# ------------------------------------------------------------------ non-finite (defect 5)
@pytest.mark.parametrize("argv,flag", [
    (["--runner.step-timeout-s", "inf"], "--runner.step-timeout-s"),
    (["--runner.step-timeout-s", "Infinity"], "--runner.step-timeout-s"),
    (["--set", "runner.step_timeout_s=NaN"], "--set runner.step_timeout_s"),
])
def test_infinite_step_timeout_flag_is_a_usage_error(argv: list[str], flag: str) -> None:
    # config_from, not main: on a build that accepted inf, main would start a collection
    from rollbank.cli.collect import config_from
    from rollbank.cli.main import build_parser

    args = build_parser().parse_args(["collect", *argv])
    with pytest.raises(UsageError, match=flag):
        config_from(args)


def test_infinite_values_in_a_config_file_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[runner]\nstep_timeout_s = inf\n")
    with pytest.raises(ConfigError, match="finite") as exc:
        load_collect_config(f)
    assert exc.value.field == "runner.step_timeout_s"


def test_the_shared_json_reader_refuses_what_json_cannot_carry() -> None:
    from rollbank.config import parse_json_input

    for text, what in (("[NaN]", "finite"), ('{"a": [1, Infinity]}', "finite"),
                       ("1" * DEEP, "digit"), ("[" * 101 + "]" * 101, "nested too deeply"),
                       ("{", "not JSON")):
        with pytest.raises(InputError, match=what):
            parse_json_input(text, file="f.json")
    with pytest.raises(InputError) as exc:
        parse_json_input('{"a": [1, Infinity]}', file="f.json")
    assert exc.value.field == "a.1"
    assert parse_json_input('{"a": [1.5, {"b": null}]}') == {"a": [1.5, {"b": None}]}
