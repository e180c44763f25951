"""rollbank: collect agentic-RL rollouts and hand a trainer complete, trustworthy batches."""

__version__ = "0.1.0"
