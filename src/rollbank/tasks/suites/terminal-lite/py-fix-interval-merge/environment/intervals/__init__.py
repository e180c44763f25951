from .core import merge

__all__ = ["merge"]
