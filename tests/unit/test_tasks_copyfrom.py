"""COPY --from planning (rollbank.tasks.copystep.plan_from): pure, no builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.errors import BuildError
from rollbank.tasks import copystep
from rollbank.tasks import dockerfile as df

FILE = Path("Dockerfile")


def ins(text: str) -> df.Instruction:
    (instruction,) = df.parse(text, file=FILE)
    return instruction


def test_the_layer_digest_follows_the_stage_and_the_instruction() -> None:
    a = copystep.plan_from(ins("COPY --from=build /out/app /usr/local/bin/app"), stage_key="k1",
                           workdir="/", scope={}, file=FILE)
    b = copystep.plan_from(ins("COPY --from=build /out/app /usr/local/bin/app"), stage_key="k2",
                           workdir="/", scope={}, file=FILE)
    c = copystep.plan_from(ins("COPY --from=build /out/app /usr/bin/app"), stage_key="k1",
                           workdir="/", scope={}, file=FILE)
    assert len({a.digest, b.digest, c.digest}) == 3
    assert a.dest == "/usr/local/bin/app" and a.binds == []
    assert any(f"{copystep.FROM}/out/app" in line for line in a.script)


def test_relative_destination_globs_and_quoting() -> None:
    plan = copystep.plan_from(ins("COPY --from=0 /out/*.txt 'it s/' data/"), stage_key="k",
                              workdir="/srv", scope={}, file=FILE)
    assert plan.dest == "/srv/data"
    text = "\n".join(plan.script)
    assert f"{copystep.FROM}/out/*.txt" in text  # the glob stays active (expanded in the stage)
    assert f"{copystep.FROM}/it\\ s" in text  # other characters are escaped


def test_add_from_and_unknown_flags_are_refused() -> None:
    with pytest.raises(BuildError, match="ADD --from"):
        copystep.plan_from(ins("ADD --from=build /a /b"), stage_key="k", workdir="/", scope={}, file=FILE)
    with pytest.raises(BuildError, match="--parents"):
        copystep.plan_from(ins("COPY --from=build --parents /a /b"), stage_key="k", workdir="/", scope={},
                           file=FILE)


def test_copy_from_an_image_is_refused_with_the_line() -> None:
    with pytest.raises(BuildError, match="no earlier stage named 'nginx:latest'") as err:
        copystep.plan(ins("\n\nCOPY --from=nginx:latest /etc/nginx /x"), context=Path("/nonexistent"),
                      stage=Path("/nonexistent/stage"), workdir="/", scope={}, file=FILE)
    assert err.value.line == 3
