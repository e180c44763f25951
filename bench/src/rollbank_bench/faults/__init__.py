"""`rollbank bench faults`: a fault-injection campaign on real parts, with exact attribution.

Runs collections on real bubblewrap sandboxes, real verifiers and real engine processes
(accel-sim: a benchmark instrument, separate HTTP servers speaking vLLM's API at ~no CPU, so
the campaign fits on 2 cores) while injecting seeded faults of every kind in
:data:`.kinds.EXPECT`: from outside (signals, a frozen cgroup, a full writable layer, a killed
engine, a fault proxy, a port down, the collector SIGKILLed then resumed) and through the
model's actions (a scripted policy: :mod:`.script`); every other round is an agent round
(``harness = "agent"``: a scripted agent program behind rollbank's gateway, :mod:`.agents`,
with the agent kinds: its crash, silence, malformed requests, hang, prompts over the context,
and the gateway's engine connection reset, cut or answered malformed, :mod:`.agent_proxy`). Reports, per kind, faults injected vs
correctly attributed, and checks batches (complete groups, advantages over valid siblings),
the attempt ledger, and leaks (processes, cgroups, mounts, fds, sandbox folders) afterwards.
Prints one JSON object; exit 1 when a check fails.

Modules: :mod:`.kinds` (kinds, expected outcomes, schedule), :mod:`.script` (scripted policy),
:mod:`.inject` (sandbox injector), :mod:`.proxy` (HTTP fault proxy), :mod:`.agents` and
:mod:`.agent_proxy` (agent rounds), :mod:`.engines`,
:mod:`.tasks`, :mod:`.rig` (engines + proxy + sandboxes, one round), :mod:`.verdicts`,
:mod:`.campaign` (the in-process phase), :mod:`.crash` (collector kills),
:mod:`.checks`, :mod:`.leaks`, :mod:`.report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollbank_bench.faults.kinds import FaultKind


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--quick", action="store_true", help="CI smoke size: a few faults of every kind")
    a("--faults", type=int, default=500, help="target number of faults injected (in-process "
      "phase; the collector kills come on top)")
    a("--collector-kills", type=int, default=None,
      help="collector SIGKILL + resume cycles (default: faults / 50, at least 2)")
    a("--rate", type=float, default=0.6, help="share of attempts that get a fault")
    a("--seed", type=int, default=0, help="campaign seed (fault schedule, task order, kills)")
    a("--groups", type=int, default=4, help="G: complete groups per batch")
    a("--group-size", type=int, default=4, help="n: siblings per group")
    a("--pool-groups", type=int, default=8, help="G': groups in flight (over-provisioning)")
    a("--batches-per-round", type=int, default=2, help="batches per collection round")
    a("--max-rounds", type=int, default=200, help="stop after this many rounds")
    a("--sandbox-slots", type=int, default=12, help="sandboxes at once")
    a("--clean-tasks", type=int, default=12, help="clean tasks (besides 3 verifier-fault tasks)")
    a("--step-timeout", type=float, default=5.0, help="per-command timeout (s)")
    a("--max-host-stall", type=float, default=10.0,
      help="sandbox.local.max_host_stall_s (a frozen command is stopped as host_stalled)")
    a("--engines", type=int, default=2, help="accel-sim engine processes")
    a("--accelsim-profile", default="h100-llama3.1-8b", help="accel-sim latency profile")
    a("--kinds", type=parse_kinds, default=None,
      help="comma-separated fault kinds to inject (default: all); e.g. model_destroy,model_oom "
      "to iterate on a few kinds; verifier-fault tasks and collector kills only when named")
    a("--out", type=Path, default=Path("runs/bench-faults"), help="run folders go here")


def parse_kinds(text: str) -> tuple[FaultKind, ...]:
    """``--kinds``: fault kind names, comma-separated (a wrong name is a usage error)."""
    out = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        try:
            out.append(FaultKind(name))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"unknown fault kind {name!r} (one of {', '.join(k.value for k in FaultKind)})"
            ) from None
    if not out:
        raise argparse.ArgumentTypeError("no fault kind named")
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    from rollbank_bench.faults.report import main

    return main(args)
