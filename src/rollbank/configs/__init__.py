"""Embedded default configurations (TOML), read with importlib.resources."""
