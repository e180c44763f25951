"""Rig.lingering: which sandboxes outlive a drained round, and what the injector did to them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rollbank_bench.faults.inject import FaultLog, Injection
from rollbank_bench.faults.kinds import FaultKind
from rollbank_bench.faults.rig import Rig


def test_lingering_names_each_live_sandbox_with_the_faults_injected_into_it() -> None:
    log = FaultLog()
    log.add(Injection(FaultKind.SANDBOX_FREEZE, 7, None, {"sandbox": "b1"}))
    log.add(Injection(FaultKind.SANDBOX_SIGKILL, 8, None, {"sandbox": "b2"}))
    live = [SimpleNamespace(sandbox_id="b1", alive=True), SimpleNamespace(sandbox_id="b3", alive=False)]
    backend = SimpleNamespace(sandboxes=live)
    plane = SimpleNamespace(source=SimpleNamespace(pool=SimpleNamespace(backend=backend)))
    rig = Rig(None, None, None, plane, None, None, [], None, log, Path())  # type: ignore[arg-type]
    assert rig.live_sandboxes() == 2
    assert rig.lingering() == [{"sandbox": "b1", "alive": True, "faults": ["sandbox_freeze"]},
                               {"sandbox": "b3", "alive": False, "faults": []}]
