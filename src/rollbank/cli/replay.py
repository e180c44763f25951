"""`rollbank replay EPISODE_FILE`: re-run an episode's recorded actions in a fresh sandbox.

Loads the task from the folder recorded in the episode file (its content hash is compared),
builds its environment (cached), starts a fresh local sandbox, replays every recorded model
turn through the same harness and runner limits, runs the verifier, and reports per step
whether the observation matches and whether the reward matches, and decides the outcome
again with the same counterfactual probes as the collection (a probe of the replayed
sandbox, a re-verify on a fresh pristine sandbox on error paths), printed beside the recorded
one. Exit code 0 only if all match (observations, reward, outcome and reason).
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help="replay an episode file in a fresh sandbox", description=__doc__)
    p.add_argument("episode", type=Path, help="episode file (runs/<out>/episodes/*.json)")
    p.add_argument("--task", type=Path, help="task folder (default: the one recorded)")
    p.add_argument("--run-config", type=Path, metavar="FILE",
                   help="the run's resolved config, whose harness and sandbox settings the "
                   "replay uses (default: config.resolved.json of the episode's run folder, "
                   "<run>/episodes/../config.resolved.json; without one, default settings)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run_config(episode: Path, given: Path | None) -> tuple[Any, str]:
    """The collection config the episode ran under, and where it came from: ``given``, else
    ``config.resolved.json`` of the episode's run folder, else the defaults. Keys of other
    commands' configs (``serve-collector``'s ``[service]``) are ignored; a file that does not
    validate is an :class:`~rollbank.errors.ConfigError` naming it (exit 3)."""
    from rollbank.collect_config import CollectConfig
    from rollbank.config import read_json_input, validate
    from rollbank.errors import ConfigError

    path = given if given is not None else episode.resolve().parent.parent / "config.resolved.json"
    if given is None and not path.is_file():
        return CollectConfig.model_validate({}), "defaults (no config.resolved.json beside the episode's run)"
    data = read_json_input(path, what="run config", error=ConfigError)
    if not isinstance(data, dict):
        raise ConfigError("a resolved config must hold a JSON object", file=path)
    known = {k: v for k, v in data.items() if k in CollectConfig.model_fields}
    return validate(CollectConfig, known, source=str(path)), str(path)


def harness_for(record: Any, config: Any, episode: Path) -> Any:
    """The harness the episode ran with: the run config's (its settings), by the episode's
    recorded name; an unknown name is an :class:`~rollbank.errors.InputError` naming the file."""
    from rollbank.collect_config import CollectConfig, make_harness_for
    from rollbank.errors import InputError

    name = record.harness or config.harness
    known = typing.get_args(CollectConfig.model_fields["harness"].annotation)
    if name not in known:
        raise InputError(f"unknown harness {name!r}; known: {', '.join(known)}", file=episode,
                         field="harness")
    return make_harness_for(config.model_copy(update={"harness": name}))


async def _replay(episode: Path, task_dir: Path | None, config_path: Path | None = None
                  ) -> dict[str, Any]:
    from rollbank.episodes.replay import load_episode, replay_episode
    from rollbank.episodes.sandboxes import ColdSource, TaskVerifier
    from rollbank.sandbox.local.backend import LocalBackend
    from rollbank.tasks.loader import load_task

    record = load_episode(episode)
    config, config_source = run_config(episode, config_path)
    harness = harness_for(record, config, episode)
    task = load_task(task_dir or Path(record.task_path))
    backend = LocalBackend(config.sandbox.local)
    try:
        report = await replay_episode(
            record, task=task, source=ColdSource(backend, config.sandbox.builder, rebuild=False),
            verifier=TaskVerifier(), harness=harness)
    finally:
        await backend.aclose()
    return {**report.to_dict(), "config": config_source}


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import sys

    from rollbank.errors import RollbankError

    try:
        report = asyncio.run(_replay(args.episode, args.task, args.run_config))
    except RollbankError as exc:  # a bad episode or task file is bad input: exit 3
        print(f"rollbank replay: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(f"episode {report['episode']} (task {report['task_id']}): "
              f"{report['steps_matched']}/{report['steps_total']} observations match, "
              f"reward recorded {report['reward_recorded']} replayed {report['reward_replayed']}"
              f" -> {'MATCH' if report['ok'] else 'MISMATCH'}")
        rec, rep = report["outcome_recorded"] or {}, report["outcome_replayed"] or {}
        print(f"  outcome recorded {rec.get('outcome')}/{rec.get('reason')}"
              f"  replayed {rep.get('outcome')}/{rep.get('reason')}"
              f" -> {'same verdict' if report['outcome_match'] else 'DIFFERENT verdict'}")
        if rep.get("attribution"):
            print(f"  replayed attribution: {rep['attribution']}")
        if not report["task_hash_match"]:
            print("  the task folder changed since the episode (content hash differs)")
        if report["first_mismatch"]:
            m = report["first_mismatch"]
            print(f"  first mismatch at step {m['index']}:\n  recorded: {m['recorded'][:300]!r}"
                  f"\n  replayed: {m['replayed'][:300]!r}")
        if report["error"]:
            print(f"  error: {report['error']}")
    return 0 if report["ok"] else 1
