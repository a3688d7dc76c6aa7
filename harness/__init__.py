"""maskcheck's engine: adapters, cases, tolerance, runner, report, CLI and pytest plugin.

``from harness import audit`` is the Python API. Importing this package does not import
torch; the names below load on first use so the pytest plugin stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["audit", "AuditResult", "LoadOptions", "SpecError", "load_adapter"]


def __getattr__(name: str) -> Any:
    if name in ("audit", "AuditResult"):
        from . import runner

        return getattr(runner, name)
    if name in ("LoadOptions", "SpecError", "load_adapter"):
        from . import specs

        return getattr(specs, name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
