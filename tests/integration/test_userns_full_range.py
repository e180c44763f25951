"""The sandbox's full id range (issue 26), on REAL sandboxes: a service user owns its files.

``LocalSandboxConfig.userns_full_range``: rb-helper maps the sandbox's ids 0-65535 (to host
``userns_host_id..``) into bubblewrap's user namespace before it goes on. Before, only uid 0
was mapped (``/proc/self/uid_map`` was ``0 100000 1``): Debian's redis package's files showed
as 65534, root could not read ``/etc/redis/redis.conf`` (0640 redis:redis) and switching to
``redis`` failed with ``setresuid failed: Invalid argument``.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.protocol import SandboxSpec
from rollbank.tasks.builder import BuiltEnvironment, EnvironmentBuilder
from rollbank.tasks.loader import load_task

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parents[1] / "fixtures"
REDIS = ("FROM ubuntu:24.04\nRUN apt-get update -qq && apt-get install -y -qq --no-install-recommends "
         "redis-server >/dev/null && rm -rf /var/lib/apt/lists/*\n")


@pytest.fixture(scope="module")
def redis_env(tmp_path_factory: pytest.TempPathFactory) -> BuiltEnvironment:
    """Debian's redis-server on the base (the layer cached in the shared cache)."""
    dst = tmp_path_factory.mktemp("task") / "task"
    shutil.copytree(FIXTURES / "tasks" / "harbor-dockerfile-features", dst)
    (dst / "environment" / "Dockerfile").write_text(REDIS)
    task = dataclasses.replace(load_task(dst), workdir=None, env={})
    return EnvironmentBuilder().build(task)


@pytest.fixture
async def full_backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    be = LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "run", userns_full_range=True))
    try:
        yield be
    finally:
        await be.aclose()


async def test_a_service_user_owns_its_files_and_its_daemon_runs_as_it(
        full_backend: LocalBackend, redis_env: BuiltEnvironment) -> None:
    await full_backend._ready()
    if full_backend.userns is None:
        pytest.skip(f"sandboxes are not id-mapped here: {full_backend.userns_reason}")
    sb = await full_backend.start(SandboxSpec(layers=redis_env.layers, env=redis_env.env))
    try:
        r = await sb.exec("cat /proc/self/uid_map /proc/self/gid_map; stat -c '%U:%G %a' /etc/redis/redis.conf; "
                          "grep -c '^port' /etc/redis/redis.conf; su -s /bin/sh redis -c id")
        lines = r.stdout.split("\n")
        assert r.exit_code == 0, r
        host = full_backend.config.userns_host_id
        assert lines[0].split() == ["0", str(host), "65536"] and lines[1].split() == ["0", str(host), "65536"]
        assert lines[2] == "redis:redis 640" and lines[3] == "1"  # root reads the redis-owned file
        assert lines[4].startswith("uid=") and "(redis)" in lines[4]
        r = await sb.exec("runuser -u redis -- redis-server /etc/redis/redis.conf --port 6390 --daemonize yes "
                          "--supervised no --logfile '' --dir /var/lib/redis && sleep 0.5 && "
                          "redis-cli -p 6390 set k v >/dev/null && redis-cli -p 6390 save >/dev/null && "
                          "redis-cli -p 6390 ping && ps -o user= -C redis-server && stat -c %U /var/lib/redis/dump.rdb")
        assert r.exit_code == 0, r
        assert r.stdout.split() == ["PONG", "redis", "redis"]
        # still no nested user namespaces (what bwrap's --disable-userns gave)
        r = await sb.exec("unshare --user true")
        assert r.exit_code != 0 and "No space left on device" in r.stderr, r
        # a fork keeps the owners: the frozen writable layer holds the shifted host ids
        snap = await sb.snapshot()
        (child,) = await full_backend.fork(snap, 1)
        try:
            r = await child.exec("stat -c %U /var/lib/redis/dump.rdb; su -s /bin/sh redis -c 'test -w /var/lib/redis/dump.rdb' && echo writable")
            assert r.stdout.split() == ["redis", "writable"], r
        finally:
            await child.close()
    finally:
        await sb.close()
