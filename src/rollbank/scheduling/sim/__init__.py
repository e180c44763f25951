"""Virtual-time simulation of the real policy (:mod:`rollbank.scheduling.policy`), no I/O.

:mod:`.simulate` drives the real ``Scheduler`` with a ``FakeClock`` over a scripted workload;
:mod:`.sim_model` is what it models besides sandbox slots (servers' latency profile,
verifiers, turns); :mod:`.fluid` is one server's decode under the long-context model. Swept by
``rollbank bench schedule``. The package itself imports nothing.
"""
