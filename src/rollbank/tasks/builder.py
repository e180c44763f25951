"""Task environments as cached filesystem layers, built from Dockerfiles without Docker.

Owns: interpreting the instructions of :mod:`rollbank.tasks.dockerfile` over a base from
:func:`rollbank.tasks.bases.ensure_base`, running each filesystem step in the build sandbox
(:mod:`rollbank.tasks.buildsandbox`) and caching each resulting layer by content hash under
``<cache>/layers/<key>``.

Semantics (what each instruction does here)
- FROM: pulled as published when a configured registry serves the reference
  (:mod:`rollbank.tasks.oci`: the image's rootfs is the base layer, its USER, WORKDIR, ENV,
  ENTRYPOINT and CMD the stage's start), else mapped to a Debian base
  (:mod:`rollbank.tasks.bases`), approximations reported; ``--platform`` ignored. Multi-stage: every ``FROM [AS name]`` starts a stage (from a base, or
  from an earlier stage by name); ``COPY --from=<name|index>`` copies from an earlier stage
  (mounted read-only in the build sandbox); the last stage is the environment. The build
  timeout covers all stages.
- After the Dockerfile: on minimal bases (debian:*, ``-slim`` language images) the verifier
  kit (:data:`rollbank.tasks.bases.VERIFIER_KIT`) as one more layer; ``environment/skills``
  copied to ``[environment] skills_dir`` when both exist; ``[environment] workdir``.
- RUN (shell form via SHELL, default ``/bin/sh -c``; exec form; here-documents), WORKDIR
  (``mkdir -p``), COPY and ADD (local files, see :mod:`rollbank.tasks.copystep`): each one
  layer.
- ENV, ARG (defaults; no build-args), USER (later RUN steps run through ``runuser``), SHELL:
  change state only. CMD, ENTRYPOINT (an ENTRYPOINT resets the base's CMD): kept in
  ``BuiltEnvironment.entrypoint``/``cmd``. LABEL, EXPOSE, STOPSIGNAL, HEALTHCHECK, VOLUME,
  MAINTAINER, ONBUILD: recorded in ``BuiltEnvironment.notes``, no effect.
- Errors (BuildError naming Dockerfile and line): ``COPY --from`` an image, ADD of a URL,
  unknown flags, sources missing or escaping the context, failing or timed-out RUN steps.

Invariants
- A layer key chains the parent key, the instruction (after substitution), the step's
  environment, user and workdir, and the hash of every copied file: same inputs, same layer.
- A layer directory is only ever visible complete: built in ``.tmp-*`` and renamed into place;
  builders of the same key serialise on a per-key lock file; a failure removes its temp dir.
- ``build_timeout_sec`` bounds the sum of the step run times of one build.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import hashlib
import json
import os
import posixpath
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollbank.config import cache_dir
from rollbank.errors import BuildError
from rollbank.tasks import bases, buildah, buildsandbox, copystep, oci, shims
from rollbank.tasks import dockerfile as df
from rollbank.tasks.config import BuilderConfig
from rollbank.tasks.model import Task

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYTHON_IMAGE = re.compile(r"(^|/)python(:|$)|/python-3-\d+")


@dataclass(frozen=True)
class BuiltEnvironment:
    """A built task environment: what a SandboxSpec needs, plus provenance."""

    task_id: str
    layers: tuple[Path, ...]  # lowest first, the base root filesystem included
    workdir: str
    env: dict[str, str]
    layer_hashes: tuple[str, ...]  # base digest, then one key per step (empty layers included)
    approximations: tuple[str, ...]
    base_image: str
    build_s: float
    cached: bool  # True when no step had to run (every layer came from the cache)
    user: str | None = None
    notes: tuple[str, ...] = ()
    steps_built: int = 0
    pinned_digests: tuple[str, ...] = ()  # @sha256 digests the FROM lines pinned (recorded, not pulled)
    pulled: tuple[str, ...] = ()  # docker://<registry>/<repo>@<digest> of each base pulled as published
    entrypoint: tuple[str, ...] = ()  # the image's ENTRYPOINT (pulled base, then the Dockerfile's)
    cmd: tuple[str, ...] = ()  # the image's CMD (reset by an ENTRYPOINT, as Docker does)
    builder: str = "interpreter"  # who ran the Dockerfile: "buildah" or rollbank's "interpreter"

    def start_command(self, command: tuple[str, ...] | None = None) -> tuple[str, ...]:
        """What ``docker run IMAGE [command...]`` runs: ENTRYPOINT + (command or CMD)."""
        return (*self.entrypoint, *(self.cmd if command is None else command))


@dataclass
class _State:
    file: Path
    key: str
    layers: list[Path]
    hashes: list[str]
    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    args: dict[str, str] = field(default_factory=dict)
    global_args: dict[str, str] = field(default_factory=dict)  # ARGs declared before FROM
    workdir: str = "/"
    user: str | None = None
    shell: list[str] = field(default_factory=lambda: ["/bin/sh", "-c"])
    notes: list[str] = field(default_factory=list)
    built: int = 0
    run_s: float = 0.0
    name: str | None = None  # the stage's ``AS`` name
    base: bases.BaseImage | None = None
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


class EnvironmentBuilder:
    """Builds (or finds cached) layers for a task's environment. Thread-safe per key."""

    def __init__(self, config: BuilderConfig | None = None) -> None:
        self.config = config or BuilderConfig()
        root = Path(self.config.cache_root) if self.config.cache_root else cache_dir() / "layers"
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._images = oci.ImageStore(Path(self.config.images_root) if self.config.images_root else None)
        self._reap()

    def _reap(self) -> None:
        """Remove temp dirs of builders that died (SIGKILL): ``.tmp-<pid>-*`` of dead pids."""
        for d in self.root.glob(".tmp-*"):
            pid = d.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(d, ignore_errors=True)

    async def build_async(self, task: Task) -> BuiltEnvironment:
        """:meth:`build` in a worker thread (builds block on subprocesses and locks)."""
        return await asyncio.to_thread(self.build, task)

    def build(self, task: Task) -> BuiltEnvironment:
        """Build (or find cached) every layer of ``task``'s environment.

        Raises :class:`BuildError` naming the Dockerfile and line; leaves no temp state.
        """
        start = time.monotonic()
        if task.dockerfile is not None:
            file = task.dockerfile
            instructions = df.parse_file(file)
        else:
            file = task.path / "task.toml"
            instructions = [df.Instruction("FROM", task.docker_image or "", 1, (), task.docker_image or "")]
        if not instructions or instructions[0].keyword not in ("FROM", "ARG"):
            raise BuildError("the first instruction must be FROM", file=file, line=1)
        st: _State | None = None
        pre_args: dict[str, str] = {}
        approximations: list[str] = []
        stages: dict[str, _State] = {}
        if task.dockerfile is not None and task.docker_image:
            approximations.append(f"docker_image {task.docker_image!r} ignored: built from the Dockerfile")
        deadline = task.build_timeout_s
        st, chosen, why, pinned = self._buildah(task, instructions, file, deadline)
        for ins in instructions if st is None else ():
            if ins.keyword == "FROM":
                if st is not None:  # the previous stage is complete: COPY --from and FROM may name it
                    stages[str(len(stages))] = st
                    if st.name:
                        stages[st.name.lower()] = st
                st = self._start_stage(task, ins, pre_args, file, stages, st, approximations, deadline)
                continue
            if st is None:
                if ins.keyword == "ARG":
                    for k, v in df.parse_key_values(ins.rest, keyword="ARG", file=file, line=ins.line):
                        pre_args[k] = df.substitute(v, pre_args)
                    continue
                raise BuildError(f"{ins.keyword} before FROM", file=file, line=ins.line)
            self._step(task, st, ins, deadline, stages)
        assert st is not None and st.base is not None
        if why:
            st.notes.append(f"built by rollbank's own interpreter, not buildah: {why}")
        if st.base.needs_kit:
            kit = df.Instruction("RUN", bases.VERIFIER_KIT, 0, (), bases.VERIFIER_KIT)
            self._layer(task, st, kit, ["/bin/sh", "-c", bases.VERIFIER_KIT], {"kit": bases.VERIFIER_KIT},
                        deadline, workdir="/", user_override=True)
            st.notes.append("verifier kit added on top (python3, pytest 8.4.1, curl, tmux): rollbank's "
                            "offline verifier needs them; the task's own steps ran without them")
        if task.skills_source is not None and task.skills_dir is not None:
            text = f"skills/ {task.skills_dir}"
            self._copy(task, st, df.Instruction("COPY", text, 0, (), text), deadline,
                       context=task.skills_source.parent)
            st.notes.append(f"skills: environment/skills copied to {task.skills_dir}")
        if task.workdir is not None and task.workdir != st.workdir:
            self._step(task, st, df.Instruction("WORKDIR", task.workdir, 0, (), task.workdir), deadline, stages)
        env = {**st.env, **task.env}
        pins = tuple(dict.fromkeys(s.base.pinned_digest for s in [*stages.values(), st]
                                   if s.base is not None and s.base.pinned_digest))
        pulled = pinned or tuple(dict.fromkeys(s.base.pulled for s in [*stages.values(), st]
                                               if s.base is not None and s.base.pulled))
        return BuiltEnvironment(
            task_id=task.task_id, layers=tuple(st.layers), workdir=st.workdir, env=env,
            layer_hashes=tuple(st.hashes), approximations=tuple(dict.fromkeys(approximations)),
            base_image=st.base.image, build_s=time.monotonic() - start, cached=st.built == 0,
            user=st.user, notes=tuple(st.notes), steps_built=st.built, pinned_digests=pins,
            pulled=pulled, entrypoint=st.entrypoint, cmd=st.cmd, builder=chosen,
        )

    def _buildah(self, task: Task, instructions: list[df.Instruction], file: Path,
                 deadline: float) -> tuple[_State | None, str, str, tuple[str, ...]]:
        """(the last stage, "buildah", "", the pinned bases) when buildah
        (:mod:`rollbank.tasks.buildah`) built the Dockerfile, else (None, "interpreter", why, ())."""
        if task.dockerfile is None:
            return None, "interpreter", "", ()
        plan, why = buildah.plan(instructions, file.read_text(), self.config, self._images, file=file)
        if plan is None:
            if self.config.builder == "buildah":
                raise BuildError(f"[builder] builder = buildah, but buildah cannot build this: {why}", file=file)
            return None, "interpreter", why, ()
        try:
            res = buildah.build(plan, context=task.context_dir, content_hash=task.content_hash,
                                layers_root=self.root, timeout_s=deadline, store=self._images)
        except BuildError as exc:
            raise BuildError(str(exc), file=file) from exc
        cfg = res.config
        froms = ", ".join(p.removeprefix("docker://") for p in plan.pinned) or "scratch"
        base = bases.BaseImage(froms, "buildah", res.rootfs, res.key, (), env=dict(cfg.env), config=cfg)
        st = _State(file, res.key, [res.rootfs], [res.key], env={"PATH": DEFAULT_PATH, **cfg.env},
                    workdir=cfg.workdir or "/", user=cfg.user, base=base, entrypoint=cfg.entrypoint,
                    cmd=cfg.cmd, built=0 if res.cached else 1)
        st.notes.append(f"built by {buildah.version()} (bud --isolation chroot), bases {froms}")
        return st, "buildah", "", plan.pinned

    def _start_stage(self, task: Task, ins: df.Instruction, pre_args: dict[str, str], file: Path,
                     stages: dict[str, _State], prev: _State | None, approximations: list[str],
                     deadline: float) -> _State:
        """A new build stage: from a base image, or from an earlier stage (``FROM <name>``)."""
        for name, _ in ins.flags:
            if name != "platform":
                raise BuildError(f"FROM --{name} is not supported", file=file, line=ins.line)
        words = df.substitute(ins.rest, pre_args).split()
        if not words or (len(words) != 1 and not (len(words) == 3 and words[1].lower() == "as")):
            raise BuildError(f"cannot parse FROM {ins.rest!r}", file=file, line=ins.line)
        alias = words[2] if len(words) == 3 else None
        parent = stages.get(words[0].lower())
        if parent is not None:
            st = dataclasses.replace(parent, layers=list(parent.layers), hashes=list(parent.hashes),
                                     env=dict(parent.env), args={}, global_args=dict(pre_args), name=alias)
        else:
            base = bases.base_for(words[0], self.config, file=file, line=ins.line, store=self._images)
            approximations += base.approximations
            st = _State(file, base.digest, [base.path], [base.digest], global_args=dict(pre_args),
                        env={"PATH": DEFAULT_PATH, **base.env}, name=alias, base=base)
            if base.config is not None:  # a pulled image: its config is the stage's start
                st.workdir, st.user = base.config.workdir or "/", base.config.user
                st.entrypoint, st.cmd = base.config.entrypoint, base.config.cmd
        if prev is not None:  # one budget, one step count and one list of notes for the build
            st.run_s, st.built, st.notes = prev.run_s, prev.built, prev.notes
        if parent is not None:
            return st
        if PYTHON_IMAGE.search(words[0]) and st.base is not None and st.base.config is None:
            # python:* images have `python` and `pip`; Debian has python3/pip3 only.
            compat = "ln -sf /usr/bin/python3 /usr/local/bin/python && ln -sf /usr/bin/pip3 /usr/local/bin/pip"
            self._layer(task, st, df.Instruction("RUN", compat, 0, (), compat),
                        ["/bin/sh", "-c", compat], {"compat": compat}, deadline)
            st.notes.append("python image: /usr/local/bin/python and pip link to python3/pip3")
        if (task.context_dir / ".dockerignore").exists() and not prev:
            st.notes.append(".dockerignore is not applied (every context file is visible)")
        return st

    # ------------------------------------------------------------------ instructions
    def _step(self, task: Task, st: _State, ins: df.Instruction, budget: float,
              stages: dict[str, _State]) -> None:
        kw, file, line = ins.keyword, st.file, ins.line
        scope = {**st.args, **st.env}
        if kw == "ENV":
            for k, v in df.parse_key_values(ins.args, keyword="ENV", file=file, line=line):
                st.env[k] = df.substitute(v, {**st.args, **st.env})
        elif kw == "ARG":
            for k, v in df.parse_key_values(ins.args, keyword="ARG", file=file, line=line):
                # `ARG X` after FROM takes the default of a global `ARG X=...` (as Docker does)
                default = st.global_args.get(k, "") if "=" not in ins.args else v
                st.args[k] = df.substitute(default, scope)
        elif kw == "USER":
            st.user = df.substitute(ins.args, scope).strip() or None
            if st.user in ("root", "0", "0:0", "root:root"):
                st.user = None
        elif kw == "SHELL":
            shell = ins.exec_form()
            if not shell:
                raise BuildError("SHELL needs the JSON exec form", file=file, line=line)
            st.shell = shell
        elif kw in ("CMD", "ENTRYPOINT"):
            argv = ins.exec_form()
            words = tuple(argv) if argv is not None else (*st.shell, ins.rest.strip())
            if kw == "CMD":
                st.cmd = words
            else:  # Docker: an ENTRYPOINT resets the CMD inherited from the base
                st.entrypoint, st.cmd = words, ()
            st.notes.append(f"line {line}: {kw} {ins.args[:80]} kept as the image's {kw.lower()} (not run)")
        elif kw in df.RECORDED:
            st.notes.append(f"line {line}: {kw} {ins.args[:80]} recorded, not applied")
        elif kw == "WORKDIR":
            path = df.substitute(ins.args, scope).strip()
            st.workdir = posixpath.normpath(posixpath.join(st.workdir, path))
            self._layer(task, st, ins, ["mkdir", "-p", st.workdir], {"workdir": st.workdir}, budget,
                        workdir="/")
        elif kw == "RUN":
            self._run(task, st, ins, budget)
        elif kw in ("COPY", "ADD"):
            source = dict(ins.flags).get("from")
            stage = stages.get(df.substitute(source, scope).lower()) if source is not None else None
            if stage is not None:
                self._copy_from(task, st, ins, budget, stage)
            else:
                self._copy(task, st, ins, budget)

    def _run(self, task: Task, st: _State, ins: df.Instruction, budget: float) -> None:
        for name, _ in ins.flags:
            raise BuildError(f"RUN --{name} is not supported", file=st.file, line=ins.line)
        argv = ins.exec_form()
        if argv is None:
            text = ins.rest
            if ins.heredocs and re.fullmatch(rf"<<-?([\"']?){ins.heredocs[0].name}\1", text.strip()):
                text = ins.heredocs[0].body  # `RUN <<EOF`: the body is the script
            elif ins.heredocs:
                text = text + "\n" + "".join(f"{h.body}{h.name}\n" for h in ins.heredocs)
            argv = [*st.shell, text]
        if st.user:
            argv = ["runuser", "-u", st.user, "--", *argv]
        self._layer(task, st, ins, argv, {"argv": argv}, budget)

    def _copy_from(self, task: Task, st: _State, ins: df.Instruction, budget: float, stage: _State) -> None:
        plan = copystep.plan_from(ins, stage_key=stage.key, workdir=st.workdir,
                                  scope={**st.args, **st.env}, file=st.file)
        self._layer(task, st, ins, ["/bin/sh", "-c", "\n".join(plan.script)],
                    {"dest": plan.dest, "sources": plan.digest, "script": plan.script}, budget,
                    workdir="/", stages=[(stage.layers, copystep.FROM)])

    def _copy(self, task: Task, st: _State, ins: df.Instruction, budget: float,
              context: Path | None = None) -> None:
        scratch = self._scratch_dir()
        try:
            plan = copystep.plan(ins, context=context or task.context_dir, stage=scratch / "stage",
                                 workdir=st.workdir, scope={**st.args, **st.env}, file=st.file)
            self._layer(task, st, ins, ["/bin/sh", "-c", "\n".join(plan.script)],
                        {"dest": plan.dest, "sources": plan.digest, "script": plan.script}, budget,
                        workdir="/", binds=plan.binds, scratch=scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    # ------------------------------------------------------------------ layers
    def _shims(self) -> Path:
        """The build-time shims (:func:`rollbank.tasks.shims.build_shim_files`) on the host."""
        files = shims.build_shim_files()
        digest = hashlib.sha256(json.dumps(sorted((k, v[0].hex()) for k, v in files.items())).encode())
        target = self.root / f".build-shims-{digest.hexdigest()[:16]}"
        if not target.is_dir():
            tmp = self._scratch_dir()
            for name, (data, mode) in files.items():
                (tmp / name).write_bytes(data)
                (tmp / name).chmod(mode)
            try:
                tmp.rename(target)
            except OSError:  # another builder won the race: same content
                shutil.rmtree(tmp, ignore_errors=True)
        return target

    def _scratch_dir(self) -> Path:
        d = self.root / f".tmp-{os.getpid()}-{time.monotonic_ns()}"
        d.mkdir()
        return d

    def _layer(self, task: Task, st: _State, ins: df.Instruction, argv: list[str],
               what: dict[str, object], budget: float, *, workdir: str | None = None,
               binds: list[tuple[Path, str]] | None = None, scratch: Path | None = None,
               stages: list[tuple[list[Path], str]] | None = None, user_override: bool = False) -> None:
        env = {"HOME": "/root", "DEBIAN_FRONTEND": "noninteractive", **st.args, **st.env}
        step_workdir = workdir or st.workdir
        desc = {"parent": st.key, "keyword": ins.keyword, "what": what, "env": sorted(env.items()),
                "user": None if user_override else st.user, "workdir": step_workdir}
        key = hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:32]
        target = self.root / key
        if not target.exists():
            self._build_layer(task, st, ins, key, argv, env, step_workdir, budget, binds, scratch, stages)
        st.key = key
        st.hashes.append(key)
        if (self.root / f"{key}.json").exists() and json.loads((self.root / f"{key}.json").read_text()).get("empty"):
            return
        st.layers.append(target)

    def _build_layer(self, task: Task, st: _State, ins: df.Instruction, key: str, argv: list[str],
                     env: dict[str, str], workdir: str, budget: float,
                     binds: list[tuple[Path, str]] | None, scratch: Path | None,
                     stages: list[tuple[list[Path], str]] | None = None) -> None:
        target = self.root / key
        locks = self.root / ".locks"
        locks.mkdir(exist_ok=True)
        with (locks / f"{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if target.exists():
                return
            own = scratch is None
            work = scratch or self._scratch_dir()
            try:
                remaining = budget - st.run_s
                if remaining <= 0:
                    raise BuildError(f"build_timeout_sec ({budget:g}s) exhausted before this step",
                                     file=st.file, line=ins.line or None)
                res = buildsandbox.run_step(lowers=st.layers, scratch=work, argv=argv, env=env,
                                            workdir=workdir, timeout_s=remaining, binds=binds or (),
                                            network=self.config.network, shims=self._shims(),
                                            log=work / "log", stages=stages or ())
                st.run_s += res.duration_s
                where = f"{ins.keyword} {ins.args[:120]}"
                if res.timed_out:
                    raise BuildError(f"{where}: timed out (build_timeout_sec {budget:g}s)\n{res.log_tail}",
                                     file=st.file, line=ins.line or None)
                if res.exit_code != 0:
                    raise BuildError(f"{where}: exited with {res.exit_code}\n{res.log_tail}",
                                     file=st.file, line=ins.line or None)
                upper = work / "upper"
                empty = not any(upper.iterdir())
                meta = {"task": task.task_id, "file": str(st.file), "line": ins.line,
                        "instruction": f"{ins.keyword} {ins.args}"[:2000], "parent": st.key,
                        "duration_s": round(res.duration_s, 3), "empty": empty}
                (self.root / f"{key}.json").write_text(json.dumps(meta, indent=1) + "\n")
                shutil.copyfile(work / "log", self.root / f"{key}.log")
                upper.rename(target)
                st.built += 1
            finally:
                if own:
                    shutil.rmtree(work, ignore_errors=True)
                else:
                    for sub in ("upper", "work", "merged"):
                        shutil.rmtree(work / sub, ignore_errors=True)
