"""Fuzzed task folders into the loaders (issue #13, item 3).

task.toml / task.yaml / docker-compose.yaml / solution.yaml assembled from hostile fragments
(NaN, inf, 1e400, NUL, wrong types, deep nesting), instruction files in any encoding,
Dockerfiles from instruction fragments, and folders with symlinks (inside, outside, dangling,
looping) and fifos. Loading returns a sane :class:`Task` or raises an :class:`InputError`
(TaskError / BuildError) naming the file; nothing else, and no hang. Image references and
Dockerfile text are fuzzed on their own too.

``ROLLBANK_FUZZ_EXAMPLES=N`` raises the number of examples (the longer campaign).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollbank.errors import BuildError, InputError, TaskError
from rollbank.tasks import dockerfile as df
from rollbank.tasks import imageref
from rollbank.tasks.config import LoaderConfig
from rollbank.tasks.loader import load_task
from rollbank.tasks.model import Task

FUZZ = int(os.environ.get("ROLLBANK_FUZZ_EXAMPLES", "0"))


def budget(n: int) -> settings:
    return settings(max_examples=FUZZ or n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLBANK_CACHE", str(tmp_path / "cache"))  # TB1 solution.yaml output


LITERALS = st.sampled_from([
    "1", "0", "-1", "300.0", "nan", "inf", "-inf", "1e400", "1" + "0" * 30, "true", "false",
    '"x"', '""', '"\\u0000"', '"/abs"', '"rel/dir"', "[]", '["a", "b"]', "[1, 2]", "{}", "{a = 1}",
    '{A = "b"}', '{"" = "x"}', '{"A=B" = "x"}', '{A = "\\u0000"}', "{A = nan}", "1979-05-27",
    "07:32:00", "[[1], [2]]", '"' + "a" * 300 + '"', "[" * 3000 + "]" * 3000,
])
TOML_KEYS = {
    "": ["version", "schema_version", "extra_top"],
    "metadata": ["difficulty", "category", "tags", "cost", "author_name", "custom"],
    "agent": ["timeout_sec", "user"],
    "verifier": ["timeout_sec", "env"],
    "environment": ["build_timeout_sec", "docker_image", "cpus", "memory_mb", "storage_mb",
                    "allow_internet", "services", "workdir", "env", "skills_dir"],
    "solution": ["env"],
    "task": ["name", "keywords"],
}


@st.composite
def toml_text(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:  # raw noise now and then
        return draw(st.text(max_size=200))
    lines: list[str] = []
    for section, keys in TOML_KEYS.items():
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=3))
        if not chosen and section:
            continue
        if section:
            lines.append(f"[{section}]")
        lines += [f"{k} = {draw(LITERALS)}" for k in chosen]
    if draw(st.integers(0, 4)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(
            ["[[steps]]", 'name = "s1"', "[metadata", "= 1", "a = ", "[agent]", "mcp_servers = []"])))
    return "\n".join(lines) + "\n"


YAML_VALUES = st.sampled_from([
    "1", "-1", ".nan", ".inf", "1e400", "null", "true", "x", "''", "[a, b]", "[1, 2]", "{a: 1}",
    "pytest", "other", "'\\0'", '"\\0"', "&a [1]", "*a", "!!binary aGk=", "[" * 800,
    "{client: {}}", "{client: {}, 2: x}", "[[a]]", "|\n  multi\n  line",
])
YAML_KEYS = ["instruction", "descriptions", "difficulty", "category", "tags", "parser_name",
             "max_agent_timeout_sec", "max_test_timeout_sec", "run_tests_in_same_shell", "cost",
             "unknown_key", "services"]


@st.composite
def yaml_text(draw: st.DrawFn, keys: list[str] = YAML_KEYS) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    pairs = draw(st.lists(st.tuples(st.sampled_from(keys), YAML_VALUES), max_size=6))
    return "".join(f"{k}: {v}\n" for k, v in pairs)


DOCKER_LINES = st.sampled_from([
    "FROM debian:bookworm-slim", "FROM debian\n", "FROM ubuntu@sha256:" + "a" * 64, "FROM a b c",
    "FROM ${BASE:-debian}", "ARG BASE", "ARG", "ENV A=1 B=\"2 3\"", "ENV A", "ENV =x", "ENV A 'b",
    "RUN echo hi", "RUN [\"bash\", \"-c\", \"ls\"]", "RUN [" + "[" * 3000, "RUN <<EOF", "EOF",
    "RUN <<-'X'\n\tbody\n\tX", "COPY . /app", "COPY ../x /", "COPY /etc/passwd /", "COPY [\"a\"",
    "COPY [" * 100, "COPY --from=0 /a /b", "ADD http://x/y /y", "WORKDIR /w", "USER root",
    "SHELL [\"/bin/sh\", \"-c\"]", "CMD ls", "HEALTHCHECK NONE", "BOGUS x", "# escape=`",
    "# syntax=docker/dockerfile:1", "run echo lower", "RUN a \\", "\\", "  ", "\x00", "\udcff",
    "COPY link /x", "COPY loop /x", "COPY sub /x",
])
DOCKERFILES = st.lists(DOCKER_LINES, max_size=10).map("\n".join)
ENCODED_TEXT = st.one_of(
    st.text(max_size=100).map(lambda t: t.encode("utf-8", errors="surrogatepass")),
    st.binary(max_size=100),
    st.text(max_size=50).map(lambda t: t.encode("utf-16")),
    st.sampled_from([b"", b"   \n", b"\xef\xbb\xbfWrite ready", b"Write ready\n", b"\x00\x00"]),
)
EXTRAS = st.lists(st.sampled_from(
    ["link-inside", "link-outside", "link-dangling", "link-loop", "fifo", "tests-link-out",
     "no-test-sh", "no-dockerfile", "compose", "solve-link-out", "big-file", "steps-dir",
     "non-utf8-name"]),
    unique=True, max_size=4)


def write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8", errors="surrogatepass")
    path.write_bytes(data)


def add_extras(root: Path, extras: list[str], outside: Path, *, harbor: bool) -> None:
    tests = root / "tests"
    for e in extras:
        if e == "link-inside":
            (root / "link").symlink_to("tests")
        elif e == "link-outside":
            (root / "link-out").symlink_to(outside)
        elif e == "link-dangling":
            (root / "dangling").symlink_to(root / "nowhere")
        elif e == "link-loop":
            (root / "loop").symlink_to(root / "loop")
        elif e == "fifo":
            os.mkfifo(root / "fifo")
        elif e == "tests-link-out" and (tests / "test.sh").exists():
            (tests / "test.sh").unlink()
            (tests / "test.sh").symlink_to(outside)
        elif e == "no-test-sh" and (tests / "test.sh").exists():
            (tests / "test.sh").unlink()
        elif e == "no-dockerfile":
            d = root / ("environment/Dockerfile" if harbor else "Dockerfile")
            if d.exists():
                d.unlink()
        elif e == "compose":
            write(root / ("environment/docker-compose.yaml" if harbor else "docker-compose.yaml"),
                  "services:\n  client: {}\n")
        elif e == "solve-link-out":
            solve = root / ("solution/solve.sh" if harbor else "solution.sh")
            solve.parent.mkdir(exist_ok=True)
            solve.unlink(missing_ok=True)
            solve.symlink_to(outside)
        elif e == "big-file":
            write(root / "big.bin", b"x" * 5000)
        elif e == "steps-dir":
            write(root / "steps" / "s1" / "instruction.md", "step one")
        elif e == "non-utf8-name":
            write(root / os.fsdecode(b"data-\xff.txt"), "x")


SMALL = LoaderConfig(max_file_mb=0.004, max_total_mb=1.0, max_text_kb=64)


def check_load(root: Path, config: LoaderConfig | None = None) -> None:
    try:
        task = load_task(root, config)
    except InputError as exc:
        assert exc.file is not None, exc  # names the file at fault
        return
    check_task(task)


def check_task(task: Task) -> None:
    """A loaded task has nothing a sandbox or a scheduler would choke on."""
    for t in (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s, task.cpus):
        assert math.isfinite(t) and t > 0
    assert task.memory_mb > 0 and task.storage_mb > 0
    assert task.instruction.strip()
    assert task.workdir is None or (task.workdir.startswith("/") and "\0" not in task.workdir)
    for env in (task.env, task.verifier_env, task.solution_env):
        for k, v in env.items():
            assert k and "=" not in k and "\0" not in k + v
    root = task.path.resolve()
    for p in (task.dockerfile, task.solution):
        if p is not None and p.exists():
            assert root == p.resolve() or root in p.resolve().parents or p.resolve().is_relative_to(
                Path(os.environ["ROLLBANK_CACHE"]).resolve())


@budget(60)
@given(toml_text(), ENCODED_TEXT, DOCKERFILES, EXTRAS, st.booleans())
@example("[agent]\ntimeout_sec = nan\n", b"do it", "FROM debian", [], False)  # was: nan timeout
@example("[environment]\nmemory_mb = 1e400\n", b"do it", "FROM debian", [], False)  # OverflowError
@example("[environment]\ncpus = inf\n", b"do it", "FROM debian", [], False)  # was: inf cpus
@example("a = " + "[" * 3000 + "\n", b"do it", "FROM debian", [], False)  # RecursionError
@example('[environment.env]\nA = "\\u0000"\n', b"do it", "FROM debian", [], False)  # NUL in env
@example('[environment]\nworkdir = "/w\\u0000"\n', b"do it", "FROM debian", [], False)  # NUL workdir
@example("", b"do it", "FROM debian\nCOPY [" + "[" * 3000, [], False)  # RecursionError (JSON)
def test_harbor_folder_loads_or_names_the_file(toml: str, instruction: bytes, dockerfile: str,
                                               extras: list[str], small: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "task", Path(tmp) / "outside.txt"
        write(outside, "secret")
        write(root / "task.toml", toml)
        write(root / "instruction.md", instruction)
        write(root / "environment" / "Dockerfile", dockerfile)
        write(root / "environment" / "sub" / "f", "x")
        write(root / "tests" / "test.sh", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
        write(root / "solution" / "solve.sh", "echo ready\n")
        add_extras(root, extras, outside, harbor=True)
        check_load(root, SMALL if small else None)


@budget(60)
@given(yaml_text(), DOCKERFILES, st.one_of(st.none(), yaml_text(["services", "x"])),
       st.one_of(st.none(), st.sampled_from(["- command: ls\n", "- {command: 1}\n", "x: 1\n", "[" * 800,
                                             "- command: \"a\\0b\"\n"]), yaml_text()), EXTRAS)
@example("instruction: .nan\n", "FROM debian", None, None, [])
@example("instruction: x\nmax_agent_timeout_sec: .nan\n", "FROM debian", None, None, [])  # was nan
@example("instruction: x\n", "FROM debian", "services: {client: {}, 2: x}\n", None, [])  # TypeError
@example("a: " + "[" * 800 + "\n", "FROM debian", None, None, [])  # RecursionError
@example("instruction: x\n", "FROM debian", None, "[" * 800, [])  # RecursionError (solution.yaml)
def test_tbench_folder_loads_or_names_the_file(yaml_doc: str, dockerfile: str, compose: str | None,
                                               solution: str | None, extras: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "task", Path(tmp) / "outside.txt"
        write(outside, "secret")
        write(root / "task.yaml", yaml_doc)
        write(root / "Dockerfile", dockerfile)
        write(root / "sub" / "f", "x")
        write(root / "tests" / "test_outputs.py", "def test_x():\n    assert True\n")
        if compose is not None:
            write(root / "docker-compose.yaml", compose)
        if solution is not None:
            write(root / "solution.yaml", solution)
        add_extras(root, extras, outside, harbor=False)
        check_load(root)


@budget(200)
@given(DOCKERFILES | st.text(max_size=200))
def test_dockerfile_parse_raises_only_build_errors(text: str) -> None:
    try:
        instructions = df.parse(text, file="Dockerfile")
    except BuildError as exc:
        assert exc.file == "Dockerfile" and exc.line is not None
        return
    for ins in instructions:
        ins.exec_form()
        try:
            if ins.keyword in ("COPY", "ADD"):
                df.split_words(ins.rest, keyword=ins.keyword, file="Dockerfile", line=ins.line)
            if ins.keyword in ("ENV", "ARG", "LABEL"):
                df.parse_key_values(ins.rest, keyword=ins.keyword, file="Dockerfile", line=ins.line)
        except BuildError as exc:
            assert exc.line == ins.line


IMAGE_PIECES = st.sampled_from(["debian", "docker.io/library/", "ghcr.io/", "org/", ":", "@", "sha256:",
                                "a" * 64, "bookworm-slim", "\n", " ", "/", "..", "A", "ä", "-", "_", "."])


@budget(200)
@given(st.lists(IMAGE_PIECES, max_size=8).map("".join) | st.text(max_size=40))
@example("debian\n:latest")  # was: accepted, repository 'debian\n' ($ matches before a newline)
@example("debian:latest\n@sha256:" + "a" * 64)  # was: accepted, tag 'latest\n'
@example("debian\ndocker.io/library/debian")  # was: accepted (host 'debian\ndocker.io')
def test_image_refs_parse_clean_or_raise(image: str) -> None:
    try:
        ref = imageref.parse(image, file="Dockerfile", line=1)
    except BuildError as exc:
        assert exc.file == "Dockerfile" and exc.line == 1
        return
    for part in (ref.repository, ref.tag, ref.digest or ""):
        assert not any(c.isspace() for c in part), ref


# ------------------------------------------------------------ regressions (minimal examples)
def _harbor(tmp_path: Path, toml: str, dockerfile: str = "FROM debian\n") -> Path:
    root = tmp_path / "task"
    write(root / "task.toml", toml)
    write(root / "instruction.md", "do it")
    write(root / "environment" / "Dockerfile", dockerfile)
    write(root / "tests" / "test.sh", "exit 0\n")
    return root


@pytest.mark.parametrize("toml, field", [
    ("[agent]\ntimeout_sec = nan\n", "agent.timeout_sec"),  # was: a task with a NaN timeout
    ("[environment]\ncpus = inf\n", "environment.cpus"),  # was: a task with infinite cpus
    ("[environment]\nmemory_mb = 1e400\n", "environment.memory_mb"),  # was: OverflowError
    ("[environment]\nmemory_mb = nan\n", "environment.memory_mb"),  # was: ValueError (int(nan))
    ('[environment.env]\nA = "\\u0000"\n', "environment.env.A"),  # was: NUL reached the sandbox env
    ('[environment.env]\n"A=B" = "x"\n', "environment.env.A=B"),  # was: a name with '='
    ('[environment]\nworkdir = "/w\\u0000"\n', "environment.workdir"),  # was: NUL in the workdir
])
def test_bad_harbor_values_name_the_field(tmp_path: Path, toml: str, field: str) -> None:
    with pytest.raises(TaskError) as info:
        load_task(_harbor(tmp_path, toml))
    assert info.value.field == field and info.value.file is not None


def test_deep_toml_is_a_task_error(tmp_path: Path) -> None:  # was: RecursionError
    with pytest.raises(TaskError, match="nested too deeply"):
        load_task(_harbor(tmp_path, "a = " + "[" * 3000 + "\n"))


def test_deep_json_in_a_dockerfile_is_an_error_with_the_line(tmp_path: Path) -> None:  # RecursionError
    with pytest.raises(TaskError, match="nested too deeply") as info:
        load_task(_harbor(tmp_path, "", "FROM debian\nCOPY [" + "[" * 3000 + "\n"))
    assert info.value.line == 2
    assert df.parse("RUN " + "[" * 3000)[0].exec_form() is None  # shell form, not a crash


def test_tbench_yaml_errors(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    write(root / "Dockerfile", "FROM debian\n")
    write(root / "tests" / "test_outputs.py", "def test_x():\n    pass\n")
    write(root / "task.yaml", "a: " + "[" * 800 + "\n")  # was: RecursionError
    with pytest.raises(TaskError, match="nested too deeply"):
        load_task(root)
    write(root / "task.yaml", "instruction: x\n")
    write(root / "docker-compose.yaml", "services: {client: {}, 2: x}\n")  # was: TypeError in sorted()
    with pytest.raises(TaskError, match="single 'client'"):
        load_task(root)
    (root / "docker-compose.yaml").unlink()
    write(root / "solution.yaml", "[" * 800)  # was: RecursionError
    with pytest.raises(TaskError, match="nested too deeply"):
        load_task(root)


def test_image_ref_with_an_inner_newline_is_refused() -> None:
    for image in ("debian\n:latest", "debian:latest\n@sha256:" + "a" * 64):
        with pytest.raises(BuildError, match="malformed"):
            imageref.parse(image)


def test_a_non_utf8_file_name_is_hashed(tmp_path: Path) -> None:
    # was: UnicodeEncodeError out of the content hash (the name decodes to a lone surrogate)
    root = _harbor(tmp_path, "")
    before = load_task(root).content_hash
    write(root / os.fsdecode(b"data-\xff.txt"), "x")
    assert load_task(root).content_hash != before


def test_a_non_utf8_task_folder_name_is_a_task_error(tmp_path: Path) -> None:
    # was: loaded with a task id that cannot be written to JSON or Parquet as UTF-8
    root = _harbor(tmp_path, "")
    bad = root.rename(tmp_path / os.fsdecode(b"task-\xff"))
    with pytest.raises(TaskError, match="not valid UTF-8"):
        load_task(bad)
