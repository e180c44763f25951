"""Thin asyncio drivers that run the pure policy for real (:mod:`rollbank.scheduling.policy`).

:mod:`.driver` (``CollectionDriver``, the ``AttemptRunner`` seam) and the slots it lends
(:mod:`.driver_slots`), the gated driver that scores complete groups (:mod:`.gated_driver`)
with a ``PolicyScorer`` (:mod:`.scoring`: the engine's HTTP scorer and a fake), the record of
a runner that raised (:mod:`.host_error`), and the fake attempt runner (:mod:`.fake`).
The package itself imports nothing.
"""
