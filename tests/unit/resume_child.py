"""A short fake collection in its own process, for the crash/resume tests (test_resume.py).

``python resume_child.py RUN_DIR`` collects 3 batches with the fake inference fleet and fake
sandboxes; ``python resume_child.py RUN_DIR --resume`` continues a crashed one.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.collect_config import CollectConfig, load_collect_config
from rollbank.collector import collect
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference.protocol import GenerateRequest
from rollbank.inference_plane import InferencePlane
from rollbank.resume import prepare_resume
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool

TOK = FakeTokenizer()


def model(req: GenerateRequest) -> str:
    """Even slots solve the task, odd slots give up: every group has reward variance."""
    prompt = TOK.decode(list(req.prompt_token_ids))
    slot = int(req.request_id.split("/s")[1].split("/")[0])
    if "\nOutput:" in prompt.split("Task: Write hello")[-1]:
        return "DONE\n"
    return "```bash\necho hello > out.txt\n```\n" if slot % 2 == 0 else "DONE\n"


def config() -> CollectConfig:
    return load_collect_config(None, {
        "inference.calibrate": False, "metrics.live": "off", "metrics.report": False,
        "task_order_seed": None,
        "scheduler.groups_per_batch": 2, "scheduler.pool_groups": 4,
        "scheduler.bank.group_size": 2, "scheduler.num_batches": 3,
        "scheduler.sandbox_slots": 6, "scheduler.inference_slots_per_server": 3,
    })


async def main(run_dir: Path, resume: bool) -> None:
    plan = prepare_resume(run_dir) if resume else None
    cfg = plan.config if plan is not None else config()
    tasks = [make_task("hello"), make_task("hello2")]
    _, clients = make_fake_fleet(2, responder=model, decode_s_per_token=0.004)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        await collect(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes, out_dir=run_dir,
                      resume=plan)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), "--resume" in sys.argv[2:]))
