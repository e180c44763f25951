"""``harbor run`` on a prebuilt ``docker_image`` task (no Dockerfile) pulled from a local registry.

A real ``docker-registry`` on 127.0.0.1 serves the Debian base with ``USER worker``; the real
Harbor CLI (``.venv-harbor``) runs the oracle through rollbank. The oracle writes ``whoami`` to
``$HOME/who.txt``: it scores 1 only if Harbor's commands without a user ran as the image's
``USER`` (as ``docker exec`` does). A task naming an image no configured registry serves fails
at start with the task and the reference named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_registry import run, serving

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
ENV = "rollbank.integrations.harbor:RollbankEnvironment"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not HARBOR.exists(), reason=".venv-harbor is missing: run "
                       "scripts/setup_harbor.sh (needs a Python >= 3.12)"),
]

TEST_SH = """#!/bin/bash
if [ "$(cat /home/worker/who.txt 2>/dev/null)" = worker ] && [ "$(stat -c %U /home/worker/who.txt)" = worker ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _sh(*argv: str) -> None:
    run(*argv, timeout=300)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from rollbank.tasks.bases import ensure_base

    work = tmp_path_factory.mktemp("harbor-oci")
    with serving(work) as host:
        layout, bundle = work / "layout", work / "bundle"
        _sh("umoci", "init", "--layout", str(layout))
        _sh("umoci", "new", "--image", f"{layout}:img")
        _sh("umoci", "unpack", "--image", f"{layout}:img", str(bundle))
        rootfs = bundle / "rootfs"
        _sh("cp", "-a", "--one-file-system", f"{ensure_base('debian:bookworm').path}/.", f"{rootfs}/")
        with open(rootfs / "etc/passwd", "a") as f:
            f.write("worker:x:1001:1001::/home/worker:/bin/bash\n")
        with open(rootfs / "etc/group", "a") as f:
            f.write("worker:x:1001:\n")
        (rootfs / "home/worker").mkdir(parents=True)
        os.chown(rootfs / "home/worker", 1001, 1001)
        _sh("umoci", "repack", "--image", f"{layout}:img", str(bundle))
        _sh("umoci", "config", "--image", f"{layout}:img", "--config.user", "worker",
            "--config.workingdir", "/home/worker",
            "--config.env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        _sh("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:img",
            f"docker://{host}/rollbank/worker:1")
        yield f"{host}/rollbank/worker:1"


def _task(root: Path, image: str) -> None:
    for d in ("environment", "solution", "tests"):
        (root / d).mkdir(parents=True)
    (root / "task.toml").write_text(
        'version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 60.0\n\n'
        f'[environment]\ndocker_image = "{image}"\ncpus = 1\nmemory_mb = 1024\nstorage_mb = 1024\n')
    (root / "instruction.md").write_text("Write your user name to ~/who.txt.\n")
    (root / "solution" / "solve.sh").write_text('#!/bin/bash\nwhoami > "$HOME/who.txt"\n')
    (root / "tests" / "test.sh").write_text(TEST_SH)
    for p in (root / "solution" / "solve.sh", root / "tests" / "test.sh"):
        p.chmod(0o755)


def test_a_pulled_docker_image_task_runs_as_the_images_user(image: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    _task(tasks / "pulled-user", image)
    _task(tasks / "unserved", "ghcr.io/example/worker:1")
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = tmp_path / "jobs"
    proc = subprocess.run([str(HARBOR), "run", "-p", str(tasks), "-a", "oracle", "-n", "2",
                           "--env", ENV, "-o", str(out), "-y", "-q"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {Path(d["config"]["task"]["path"]).name: d
               for d in (json.loads(p.read_text()) for p in out.glob("*/*/result.json"))}
    pulled = results["pulled-user"]
    assert pulled.get("exception_info") is None, pulled.get("exception_info")
    assert pulled["verifier_result"]["rewards"] == {"reward": 1.0}
    exc = results["unserved"]["exception_info"]
    assert exc["exception_type"] == "InputError"
    assert "task unserved" in exc["exception_message"]
    assert "ghcr.io/example/worker:1" in exc["exception_message"]
