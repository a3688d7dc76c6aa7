"""Hooks the maskcheck pytest plugin calls; implement them in a repo's conftest.py."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_maskcheck_models(config: pytest.Config) -> list[Any]:
    """Models for the plugin to audit, besides ``--maskcheck-model`` and ``maskcheck_models``.

    Return a list of spec strings and/or :class:`maskcheck.harness.plugin.testing.ModelEntry` objects
    (a test id plus a factory). Factories are called when the first test of that model
    runs, never at collection, so every pytest-xdist worker collects the same tests
    cheaply. The results of every implementation are concatenated.
    """
