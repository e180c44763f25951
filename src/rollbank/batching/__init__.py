"""Trainable batches: GRPO advantages, the versioned Arrow schema, Parquet batch directories,
and the torch loader.

- :mod:`~rollbank.batching.advantages`: advantages over valid siblings only.
- :mod:`~rollbank.batching.schema`: ``SCHEMA_VERSION`` (2; 1 still read), ``SCHEMA`` and ``batch_to_table``.
- :mod:`~rollbank.batching.writer`: ``write_batch(root, batch)`` (atomic, manifest, LATEST).
- :mod:`~rollbank.batching.loader`: ``read_batch_dir``, ``table_to_tensors``,
  ``iter_tensor_batches``, ``batch_tensors`` (torch is imported only by the loader).
- :mod:`~rollbank.batching.stats`: version-lag histogram per batch.
"""
