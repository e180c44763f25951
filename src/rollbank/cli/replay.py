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
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay", help="replay an episode file in a fresh sandbox", description=__doc__)
    p.add_argument("episode", type=Path, help="episode file (runs/<out>/episodes/*.json)")
    p.add_argument("--task", type=Path, help="task folder (default: the one recorded)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


async def _replay(episode: Path, task_dir: Path | None) -> dict[str, Any]:
    from rollbank.episodes.harnesses import make_harness
    from rollbank.episodes.replay import load_episode, replay_episode
    from rollbank.episodes.sandboxes import ColdSource, TaskVerifier
    from rollbank.sandbox.local.backend import LocalBackend
    from rollbank.sandbox.local.config import LocalSandboxConfig
    from rollbank.tasks.config import BuilderConfig
    from rollbank.tasks.loader import load_task

    record = load_episode(episode)
    task = load_task(task_dir or Path(record.task_path))
    backend = LocalBackend(LocalSandboxConfig())
    try:
        report = await replay_episode(
            record, task=task, source=ColdSource(backend, BuilderConfig.model_validate({}), rebuild=False),
            verifier=TaskVerifier(), harness=make_harness(record.harness or "fenced-shell"))
    finally:
        await backend.aclose()
    return report.to_dict()


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import sys

    from rollbank.errors import RollbankError

    try:
        report = asyncio.run(_replay(args.episode, args.task))
    except RollbankError as exc:
        print(f"rollbank replay: {exc}", file=sys.stderr)
        return 2
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
