"""Integration: `rollbank numerics` on the tiny model with one real fp32 vLLM server.

Engine (fp32) and trainer (fp32) score the same sampled tokens; if the comparison aligns
tokens correctly the two agree to within numerics (1e-4 nats), both for the decode
log-probs returned with the samples and for the engine's prompt log-probs of the same
sequences. A one-position shift of the trainer's scores (the classic off-by-one) must show
up as a large mismatch, so the agreement is not vacuous.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rollbank.numerics.report import compare
from rollbank.numerics.run import (
    NumericsPlan,
    build_report,
    engine_sources,
    trainer_sources,
    write_outputs,
)

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.asyncio]


async def test_engine_fp32_matches_trainer_fp32(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plan = NumericsPlan(model="tiny", engine_dtypes=("float32",), trainer_variants=("trainer-fp32",),
                        prompts=4, max_tokens=40, compile="eager", out=tmp_path)
    seqs, sources, meta = await engine_sources(plan)
    assert set(sources) == {"engine-fp32-decode", "engine-fp32-prefill"}
    assert sum(len(s) for s in seqs.sampled) > 0
    trained, tmeta = trainer_sources(plan, seqs)
    report = build_report(plan, seqs, {**sources, **trained}, {**meta, **tmeta})
    paths = write_outputs(report, tmp_path)
    assert [p.name for p in paths] == ["numerics.json", "numerics.png"]
    assert json.loads(paths[0].read_text())["sampled_tokens"] == report["sampled_tokens"]

    comps = report["comparisons"]
    for name in ("trainer-fp32 vs engine-fp32-decode", "trainer-fp32 vs engine-fp32-prefill",
                 "engine-fp32-prefill vs engine-fp32-decode"):
        a = comps[name]["abs"]
        assert a["n"] == report["sampled_tokens"], name
        assert a["max"] < 1e-4, (name, a)
    assert report["alignment"]["baseline"] == "trainer-fp32 vs engine-fp32-decode"

    # Negative control: the trainer's scores shifted by one position disagree badly.
    ids, _, sampled = seqs.arrays()
    shifted = np.roll(trained["trainer-fp32"], 1, axis=1)
    bad = compare(sources["engine-fp32-decode"], shifted, sampled, ids)
    assert bad["abs"]["mean"] > 0.1
