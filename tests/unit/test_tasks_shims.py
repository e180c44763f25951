"""The offline verifier shims (rollbank.tasks.shims), run for real as host processes.

Every test runs the shim scripts in a clean environment (no host variables) with the shim
directory first on PATH, exactly as the verifier does inside a sandbox, and never reaches
the network: only requirements that are already installed are asked for.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rollbank.tasks.shims import SHIM_DIR, shim_files


@pytest.fixture
def shims(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "shims"
    bin_dir.mkdir()
    for name, (data, mode) in shim_files().items():
        path = bin_dir / name
        # The installer links to SHIM_DIR inside a sandbox; point it at this copy instead.
        path.write_bytes(data.replace(SHIM_DIR.encode(), str(bin_dir).encode()))
        path.chmod(mode)
    return bin_dir


def run(shims: Path, tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": f"{shims}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home),
           "ROLLBANK_VERIFIER_LOGS": str(tmp_path / "logs")}
    return subprocess.run(["/bin/bash", "-c", script], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)


def test_astral_installer_pipe_installs_the_uv_shim(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh && "
                               "source $HOME/.local/bin/env && command -v uv && command -v uvx")
    assert res.returncode == 0, res.stderr
    home_bin = tmp_path / "home" / ".local" / "bin"
    assert res.stdout.splitlines() == [str(home_bin / "uv"), str(home_bin / "uvx")]
    assert (home_bin / "uv").resolve() == (shims / "uv").resolve()
    assert "uv installer replaced" in res.stderr
    res = run(shims, tmp_path, "source $HOME/.cargo/env && command -v uv")  # older installers
    assert res.stdout.strip() == str(home_bin / "uv")


def test_curl_output_file_form_gets_the_installer(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "curl -LsSf -o install.sh https://astral.sh/uv/install.sh && sh install.sh")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "home" / ".local" / "bin" / "env").is_file()


def test_uvx_with_installed_requirements_runs_the_installed_pytest(shims: Path, tmp_path: Path) -> None:
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    res = run(shims, tmp_path, "uvx --with pytest==0.0.1 pytest -q -p no:cacheprovider test_ok.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed" in res.stdout
    assert "pytest==0.0.1: using installed pytest" in res.stderr


def test_uvx_failing_tests_propagate_the_exit_code(shims: Path, tmp_path: Path) -> None:
    (tmp_path / "test_bad.py").write_text("def test_bad():\n    assert False\n")
    res = run(shims, tmp_path, "uvx pytest -q -p no:cacheprovider test_bad.py")
    assert res.returncode == 1
    assert "1 failed" in res.stdout


def test_uv_venv_sees_system_packages(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "uv venv -p 3.11 .tbench-testing && uv python pin 3.11")
    assert res.returncode == 0, res.stderr
    cfg = (tmp_path / ".tbench-testing" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in cfg


def test_uv_pip_install_and_pip_skip_installed(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "uv pip install pytest==8.4.1 && pip install --break-system-packages pytest "
                               "&& uv add pytest && uv init && uv --version")
    assert res.returncode == 0, res.stderr
    assert "rollbank offline shim" in res.stdout


def test_missing_requirement_is_recorded_as_an_infra_error(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "PIP_NO_INDEX=1 uvx -w rollbank-no-such-package==1.0 pytest --version")
    assert res.returncode != 0
    marker = (tmp_path / "logs" / "rollbank-shim-error.txt").read_text()
    assert "rollbank-no-such-package==1.0" in marker


def test_short_with_flag(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "uvx -p 3.13 -w pytest==8.4.1 pytest --version")
    assert res.returncode == 0, res.stderr
    assert "pytest" in res.stdout + res.stderr


def test_unsupported_uv_command_fails_clearly(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "uv publish")
    assert res.returncode == 2
    assert "not supported offline" in res.stderr


def test_apt_get_update_and_install_of_installed_packages(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "apt-get update && apt-get install -y coreutils")
    assert res.returncode == 0, res.stderr
    assert "already installed" in res.stderr


@pytest.mark.parametrize(
    ("output", "reward"),
    [
        ("== short test summary info ==\nPASSED t.py::a\nPASSED t.py::b\n", "1"),
        ("== short test summary info ==\nPASSED t.py::a\nFAILED t.py::b - x\n", "0"),
        ("== short test summary info ==\nERROR t.py - ImportError\n", "0"),
    ],
)
def test_tb1_verify_turns_the_pytest_summary_into_a_reward(shims: Path, tmp_path: Path,
                                                          output: str, reward: str) -> None:
    (tmp_path / "out.txt").write_text(output)
    res = run(shims, tmp_path, "rollbank-tb1-verify cat out.txt")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "logs" / "reward.txt").read_text().strip() == reward
    assert (tmp_path / "logs" / "test-output.txt").read_text() == output


def test_tb1_verify_without_a_summary_writes_no_reward(shims: Path, tmp_path: Path) -> None:
    res = run(shims, tmp_path, "rollbank-tb1-verify sh -c 'echo no pytest here; exit 4'")
    assert res.returncode == 4
    assert not (tmp_path / "logs" / "reward.txt").exists()
