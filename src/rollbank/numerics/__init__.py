"""Engine/trainer numerics alignment (``rollbank numerics``, issue #11 item 4).

Layer: a command-level tool above :mod:`rollbank.inference` and :mod:`rollbank.training`.
:mod:`~rollbank.numerics.report` holds the pure math, :mod:`~rollbank.numerics.measure` the
scoring, :mod:`~rollbank.numerics.run` one run, :mod:`~rollbank.numerics.plot` the PNG.
"""
