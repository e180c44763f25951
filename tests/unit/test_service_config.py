"""serve-collector's configuration, token sources, flags, committed OpenAPI schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.cli.main import build_parser, main
from rollbank.config import dump_resolved
from rollbank.errors import ConfigError
from rollbank.service.app import openapi_schema
from rollbank.service.config import ServiceSection, load_service_config, resolve_token

DOCS = Path(__file__).resolve().parents[2] / "docs"
GOOD = "0123456789abcdef0123"


def test_committed_openapi_schema_matches_the_app() -> None:
    committed = json.loads((DOCS / "service-openapi.json").read_text())
    assert committed == openapi_schema(), (
        "docs/service-openapi.json is out of date: python -m rollbank.service.app > docs/service-openapi.json")
    assert committed["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, ops in committed["paths"].items():
        for op in ops.values():
            assert op["security"] == [{"HTTPBearer": []}], path


def test_token_sources_in_order(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(f"  {GOOD}x\n")
    env = {"ROLLBANK_SERVICE_TOKEN": GOOD + "e", "OTHER": GOOD + "o"}
    assert resolve_token(ServiceSection.model_validate({"token": GOOD, "token_file": str(f)}), env) == GOOD
    assert resolve_token(ServiceSection.model_validate({"token_file": str(f)}), env) == GOOD + "x"
    assert resolve_token(ServiceSection.model_validate({}), env) == GOOD + "e"
    assert resolve_token(ServiceSection.model_validate({"token_env": "OTHER"}), env) == GOOD + "o"


@pytest.mark.parametrize("section,field", [
    ({}, "service.token_env"),
    ({"token_file": "/nonexistent/token"}, "service.token_file"),
    ({"token": "short"}, "service.token"),
])
def test_no_usable_token_is_refused(section: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_token(ServiceSection.model_validate(section), {})
    assert err.value.field == field and err.value.exit_code == 3


def test_the_token_is_not_written_with_the_resolved_config(tmp_path: Path) -> None:
    cfg = load_service_config(None, {"service.token": GOOD, "service.port": 0})
    dump_resolved(cfg, tmp_path)
    text = (tmp_path / "config.resolved.json").read_text()
    assert GOOD not in text and json.loads(text)["service"]["port"] == 0


def test_flags_come_from_the_config_and_collect_flags_still_work() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve-collector", "--port", "0", "--service.lease-s", "5",
                              "--groups", "2", "--inference.kind", "fake"])
    from rollbank.cli.serve_collector import config_from

    cfg = config_from(args)
    assert cfg.service.port == 0 and cfg.service.lease_s == 5.0
    assert cfg.scheduler.groups_per_batch == 2 and cfg.inference.kind == "fake"
    assert cfg.service.host == "127.0.0.1"  # localhost unless configured


def test_serve_collector_refuses_to_start_without_a_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ROLLBANK_SERVICE_TOKEN", raising=False)
    out = tmp_path / "run"
    code = main(["serve-collector", "--inference.kind", "fake", "--port", "0", "--out", str(out)])
    assert code == 3
    assert "ROLLBANK_SERVICE_TOKEN" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written or started
    assert main(["serve-collector", "--service.lease-s", "0"]) == 2  # a bad flag: usage


def test_every_service_field_is_a_documented_flag() -> None:
    from rollbank.cli.flags import flags_of
    from rollbank.service.config import ServeCollectorConfig

    service = [f for f in flags_of(ServeCollectorConfig) if f.key.startswith("service.")]
    assert {f.key for f in service} == {f"service.{k}" for k in ServiceSection.model_fields}
    assert all(len(f.help) > 20 for f in service), [f.key for f in service if len(f.help) <= 20]
