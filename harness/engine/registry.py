"""Suites are found through the ``maskcheck.suites`` entry-point group, never imported by name.

maskcheck registers its built-in suites in that group in its own pyproject.toml, so a
third-party package adds a suite the same way.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, Callable, Sequence

GROUP = "maskcheck.suites"
PROBE_GROUP = "maskcheck.probes"


def maskcheck_version() -> str:
    """The installed maskcheck's version, as reports and bundles record it."""
    try:
        return version("maskcheck")
    except PackageNotFoundError:
        return "0+unknown"


class UnknownSuiteError(KeyError):
    pass


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def registered_suite_names() -> list[str]:
    """Every registered suite's name, sorted, read from entry-point metadata alone: no suite
    module is imported (nor torch), so ``--help`` and the plugin's settings stay cheap."""
    return sorted(_entry_points())


@lru_cache(maxsize=1)
def suite_classes() -> dict[str, type]:
    """Every registered suite's class by name, in the order suites run (``Suite.order``, then name)."""
    points = _entry_points()
    classes = {name: points[name].load() for name in points}
    return dict(sorted(classes.items(), key=lambda item: (getattr(item[1], "order", 1000), item[0])))


def suite_names(where: Callable[[type], bool] | None = None) -> list[str]:
    """Registered suites in run order; with ``where``, those whose class it accepts
    (``suite_names(lambda s: s.in_sweep)``)."""
    return [name for name, cls in suite_classes().items() if where is None or where(cls)]


def load_suite(name: str) -> Any:
    """An instance of the suite registered as ``name``."""
    points = _entry_points()
    if name not in points:
        raise UnknownSuiteError(unknown_suites_message([name], registered_suite_names()))
    return points[name].load()()  # this suite alone: the others need not be imported


def batching_gate_suite() -> type | None:
    """The suite that holds the batching gate (``Suite.batching_gate``), if one is registered."""
    return next((cls for cls in suite_classes().values() if getattr(cls, "batching_gate", None)), None)


@lru_cache(maxsize=1)
def _probe_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=PROBE_GROUP)}


def probe_names() -> list[str]:
    return sorted(_probe_points())


def load_probe(name: str) -> Any:
    """The ``(runner, picture)`` pair registered as probe ``name``."""
    points = _probe_points()
    if name not in points:
        raise UnknownSuiteError(f"unknown probe {name!r}; known: {', '.join(probe_names()) or '(none registered)'}")
    return points[name].load()


def unknown_suites_message(names: Sequence[str], known: Sequence[str]) -> str | None:
    """None when every name is known; else one line naming the unknown ones, with the closest known names."""
    unknown = [name for name in names if name not in known]
    if not unknown:
        return None
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return f"unknown suite(s) {', '.join(hints)}; known: {', '.join(known)}"
