"""The maskcheck pytest plugin's hooks (entry point ``pytest11``, through the package).

``pytest --maskcheck-model SPEC`` (repeatable) adds one test per suite per model,
``maskcheck::test_maskcheck[SUITE-SPEC]``, so ``-k causal`` or ``-k "hf:./ckpt"`` select
them; each ``[[tool.maskcheck.compare]]`` pair adds ``maskcheck::test_maskcheck[compare-A-vs-B]``
and each configured collator ``maskcheck::test_maskcheck_collator[TASK-FACTORY]``
(:mod:`.items`). Collection never builds a model; a suite that does not apply is skipped
with its reason; ``warn`` becomes a :class:`maskcheck.harness.plugin.testing.MaskcheckWarning`;
a failure prints the verdict and the reproduction bundle's path.

The settings, one record each, are :data:`.settings.SETTINGS` (docs/plugin.md shows them).
Configured models and pairs join runs without test paths (``pytest``, ``pytest -n auto``);
a run that names paths leaves them out unless ``--maskcheck-always``, and the summary says
which in one red line (:mod:`.tracker`); ``--maskcheck-require`` makes that a failing run.

This module imports nothing heavy at load time: a repo with maskcheck installed that does
not use it pays only for these files. torch and transformers load when a maskcheck test runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .items import CollatorItem, CompareItem, MaskcheckItem
from .settings import (
    DEFAULT_REPORT_DIR,
    add_options,
    collects_configured,
    models,
    pairs,
    run_options,
    setting,
    suites,
    tool_config,
    validate_settings,
)
from .tracker import RunTracker, new_ledger


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "maskcheck: a test generated or marked by the maskcheck plugin")
    from . import testing

    worker = getattr(config, "workerinput", None)
    if worker is not None:
        testing.RUN_ID = worker.get("maskcheck_run_id", testing.RUN_ID)  # results carry the controller's run id
        return
    from .run_report import new_run_id

    testing.RUN_ID = new_run_id()
    ledger = None
    if models(config) or pairs(config):
        validate_settings(config)
        ledger = new_ledger(config)
    config.pluginmanager.register(RunTracker(config, ledger), "maskcheck-run-tracker")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Reproduction bundles hold failing tests: never collect them by recursion (an explicit
    path on the command line still runs them)."""
    if collection_path.name == DEFAULT_REPORT_DIR:
        return True
    report_dir = Path(config.rootpath, setting(config, "report_dir"))
    if collection_path == report_dir:
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect, so they apply to these tests too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not collects_configured(config):
        return  # `pytest some/path` runs that path; the summary says which models were left out
    added = [
        MaskcheckItem.from_parent(session, name=name, nodeid=f"maskcheck::{name}", entry=entry, suite=suite)
        for entry in models(config)
        for suite in suites(config)
        for name in [f"test_maskcheck[{suite}-{entry.name}]"]
    ]
    added += [
        CompareItem.from_parent(session, name=name, nodeid=f"maskcheck::{name}", pair=pair)
        for pair in pairs(config)
        for name in [f"test_maskcheck[compare-{pair.name}]"]
    ]
    added += [
        CollatorItem.from_parent(session, name=name, nodeid=f"maskcheck::{name}", factory=factory, task=task)
        for factory, task in tool_config(config).get("collators", [])
        for name in [f"test_maskcheck_collator[{task}-{factory}]"]
    ]
    if added:
        items.extend(added)
        # Counted as collected, so "N deselected" never exceeds what the summary says was collected.
        session.ihook.pytest_collectreport(report=pytest.CollectReport("maskcheck", "passed", None, added))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``maskcheck_adapter`` in a test's arguments: one test per configured model."""
    if "maskcheck_adapter" in metafunc.fixturenames:
        entries = models(metafunc.config)
        metafunc.parametrize(
            "maskcheck_adapter", entries, ids=[e.name for e in entries], indirect=True, scope="session"
        )


@pytest.fixture(scope="session")
def maskcheck_adapter(request: pytest.FixtureRequest) -> Any:
    """The adapter of a configured model (``--maskcheck-model``, ``maskcheck_models`` or the hook), built once per session."""
    from .testing import _SESSION_CACHE, MaskcheckFailure

    try:
        return _SESSION_CACHE.get(request.param, run_options(request.config))
    except MaskcheckFailure as failure:
        message = str(failure)
    pytest.fail(message, pytrace=False)
