"""Pure scheduling policy: state machines over injected time, decisions as data, no I/O.

The scheduler (:mod:`.scheduler`) with its owned components: where groups come from
(:mod:`.admission`) and the capacities (:mod:`.capacities`: sandbox, inference, verifier
slots); the ready bank (:mod:`.ready_bank`, its records, dynamic sampling), the ledger and the
launched pool's statistics, batch windows and the selection profile; the decisions and events
(:mod:`.types`, :mod:`.events`); and the gate on complete groups, a strategy the bank holds
them for (:mod:`.group_gate`; the staleness gate, :mod:`.gating`; :mod:`.scores`). Nothing
here imports asyncio, a driver or the simulator. The package itself imports nothing.
"""
