"""`rollbank collect` sub-command (being built)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("collect", help="(being built)")
    p.set_defaults(func=lambda args: 2)
