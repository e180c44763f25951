"""Metrics of a collection, computed from lifecycle events and finished trajectories.

- ``events``: the JSONL event log (an ``EventSink``) and its reader.
- ``bound``: the lower bound T_LB (critical path, inference work, sandbox work) and ``Capacity``.
- ``calibrate``: measures ``Capacity`` against the real inference servers.
- ``summary``: per-batch metrics (time to batch, tail share, tokens/s, busy/idle time,
  utilisation, outcomes, cache hit rate, T_LB and efficiency).
- ``report``: the HTML report with plots (extra ``report``); ``prometheus``: the endpoint;
  ``live``: rich view.
- ``scalars``: the scalar series of the events; ``tensorboard`` and ``wandb`` (offline): sinks
  logging them (extras ``tensorboard``, ``wandb``).
"""
