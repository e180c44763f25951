"""Evaluation in the serving stack (``rollbank eval``) and task-set health.

``passk.py`` (pure estimators), ``scoring.py`` (trajectories -> one result row),
``timing.py`` (per-request timings and the engine's time-to-first-token histogram),
``run.py`` (the collector run with every attempt counted), ``health.py`` (per-task solve
rates across batches and evaluations, saturated / never-solved tasks).
"""
