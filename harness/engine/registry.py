"""Suites are found through the ``maskcheck.suites`` entry-point group, never imported by name.

maskcheck registers its built-in suites in that group in its own pyproject.toml, so a
third-party package adds a suite the same way.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, Sequence

GROUP = "maskcheck.suites"
PROBE_GROUP = "maskcheck.probes"
#: the order suites run and are reported in; suites from other packages follow, by name
BUILTIN_ORDER = ("causal", "padding", "cross_attention", "loss_masking", "packing", "kv_cache", "norm_checkpoint")


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


def suite_names() -> list[str]:
    names = list(_entry_points())
    return sorted(names, key=lambda n: (BUILTIN_ORDER.index(n) if n in BUILTIN_ORDER else len(BUILTIN_ORDER), n))


def load_suite(name: str) -> Any:
    """An instance of the suite registered as ``name``."""
    points = _entry_points()
    if name not in points:
        raise UnknownSuiteError(unknown_suites_message([name], suite_names()))
    return points[name].load()()


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
