"""The benchmarks' integration tests run under the product's integration rules: the same
slow-callback check on a debug event loop and the same real-sandbox fixtures
(``tests/integration/conftest.py``, loaded from this checkout)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "tests" / "integration" / "conftest.py"
_spec = importlib.util.spec_from_file_location("rollbank_integration_conftest", _PATH)
assert _spec is not None and _spec.loader is not None
_rules = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _rules
_spec.loader.exec_module(_rules)

pytest_configure = _rules.pytest_configure
pytest_asyncio_loop_factories = _rules.pytest_asyncio_loop_factories
_no_slow_callbacks = _rules._no_slow_callbacks
base = _rules.base
backend = _rules.backend
