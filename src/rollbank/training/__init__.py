"""The built-in trainer: GRPO/PPO-style token-level policy gradient on rollbank batches.

- :mod:`~rollbank.training.config`: ``TrainerConfig`` (loss aggregation, clip, KL, LoRA/full).
- :mod:`~rollbank.training.logprobs`: sampled-token log-probs with a chunked LM head.
- :mod:`~rollbank.training.loss`: the clipped surrogate, aggregation and KL as pure functions.
- :mod:`~rollbank.training.trainer`: ``Trainer`` (load, micro-batched step, save).
- :mod:`~rollbank.training.checkpoint`: atomic versioned weight directories.
- :mod:`~rollbank.training.loop`: the closed loop (batches -> step -> save -> publish, sync or
  async with a bounded lag) and its ``Publisher`` seam; ``loop_config`` (``TrainConfig``),
  ``loop_run`` (``rollbank train``), ``loop_metrics`` (Prometheus gauges).

torch (and peft for LoRA) are imported by the submodules only, not by this package.
"""
