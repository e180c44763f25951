"""Staleness measured by divergence: estimators, importance corrections, the divergence gate.

Layering: imports ``rollbank.errors``, ``clock``, ``config``, ``episodes`` (trajectory types)
and ``batching``; nothing above (scheduling, collector, cli) imports into here. Everything is
pure numpy / pure policy; drivers obtain the current-policy log-probs and call in.
"""
