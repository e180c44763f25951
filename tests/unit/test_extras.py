"""Optional dependencies: importing rollbank never needs an extra; using a feature without
its extra names the extra to install. Each case runs in a fresh interpreter where the
extra's package is made unimportable (``sys.modules[name] = None``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK = "import sys\nfor m in {mods!r}: sys.modules[m] = None\n"


def run(mods: list[str], body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK.format(mods=mods) + body],
                          capture_output=True, text=True, timeout=120, check=False)


def test_import_rollbank_needs_no_extra() -> None:
    proc = run(["torch", "matplotlib", "transformers", "vllm", "tensorboardX", "wandb", "ray",
                "fastapi", "uvicorn"],
               "import rollbank, rollbank.collector, rollbank.cli.main\n"
               "import rollbank.service.run, rollbank.service.client\n"
               "rollbank.cli.main.build_parser()\n"
               "import rollbank.batching.loader, rollbank.metrics.report\n"
               "import rollbank.metrics.tensorboard, rollbank.metrics.wandb\n"
               "print('ok')\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize(("mods", "body", "extra"), [
    (["torch"], "from rollbank.batching.loader import table_to_tensors\n"
                "table_to_tensors(None)\n", "train"),
    (["matplotlib"], "from rollbank.metrics.report import duration_cdf\n"
                     "duration_cdf({})\n", "report"),
    (["tensorboardX"], "from pathlib import Path\n"
                       "from rollbank.metrics.tensorboard import open_tensorboard\n"
                       "open_tensorboard(Path('/nonexistent/tb'))\n", "tensorboard"),
    (["wandb"], "from pathlib import Path\n"
                "from rollbank.metrics.wandb import open_wandb\n"
                "open_wandb(Path('/nonexistent/wb'))\n", "wandb"),
    (["fastapi"], "from rollbank.service.app import openapi_schema\n"
                  "openapi_schema()\n", "service"),
    (["uvicorn"], "from rollbank.service.config import load_service_config\n"
                  "from rollbank.service.run import serve_collector\n"
                  "serve_collector(load_service_config(), say=print)\n", "service"),
])
def test_a_feature_without_its_extra_names_the_extra(mods: list[str], body: str, extra: str
                                                     ) -> None:
    proc = run(mods, body)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rollbank.extras.MissingExtraError:"), proc.stderr
    assert f"pip install 'rollbank[{extra}]'" in last
