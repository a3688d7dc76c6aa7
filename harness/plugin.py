"""The maskcheck pytest plugin (entry point ``pytest11``).

``pytest --maskcheck-model SPEC`` (repeatable) adds one test per suite per model,
``maskcheck::test_maskcheck[SUITE-SPEC]``, so ``-k causal`` or ``-k "hf:./ckpt"`` select
them. Collection never builds a model; a suite that does not apply is skipped with its
reason; ``warn`` becomes a :class:`maskcheck.harness.testing.MaskcheckWarning`; a failure prints the
verdict and the reproduction bundle's path; each check's max diff, floor and threshold go
into the JUnit XML as properties.

Settings, command line first, then ``[tool.pytest.ini_options]``, then ``[tool.maskcheck]``:

| option | ini key | default |
|---|---|---|
| ``--maskcheck-model SPEC`` (repeatable) | ``maskcheck_models`` (one per line) | none |
| ``--maskcheck-suites a,b`` | ``maskcheck_suites`` | every suite |
| ``--maskcheck-profile`` | ``maskcheck_profile`` | ``ci`` |
| ``--maskcheck-device`` | ``maskcheck_device`` | ``cpu`` |
| ``--maskcheck-dtype`` | ``maskcheck_dtype`` | the model's own |
| ``--maskcheck-report-dir`` | ``maskcheck_report_dir`` | ``maskcheck-report`` |

This module imports nothing heavy at load time: a repo with maskcheck installed that does
not use it pays only for this file. torch and transformers load when a maskcheck test runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

OPTIONS = {
    # option name: (ini key, help)
    "models": ("maskcheck_models", "model spec to audit; one test per suite (repeatable)"),
    "suites": ("maskcheck_suites", "comma-separated suites (default: every suite)"),
    "profile": ("maskcheck_profile", "dev, ci or thorough (default: ci)"),
    "device": ("maskcheck_device", "cpu, cuda, cuda:N or auto (default: cpu)"),
    "dtype": ("maskcheck_dtype", "float32, bfloat16 or float16 (default: the model's own)"),
    "report_dir": ("maskcheck_report_dir", "reports and reproduction bundles (default: maskcheck-report)"),
}
DEFAULT_REPORT_DIR = "maskcheck-report"
DEFAULTS = {"profile": "ci", "device": "cpu", "dtype": None, "report_dir": DEFAULT_REPORT_DIR, "suites": None}
#: [tool.maskcheck] keys for the same settings
CONFIG_KEYS = {"models": "models", "suites": "suites", "profile": "profile", "device": "device", "dtype": "dtype", "report_dir": "report"}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("maskcheck", "maskcheck: masking and caching invariance suites")
    for name, (ini, text) in OPTIONS.items():
        flag = "--maskcheck-model" if name == "models" else f"--maskcheck-{name.replace('_', '-')}"
        if name == "models":
            group.addoption(flag, action="append", dest="maskcheck_models", default=[], metavar="SPEC", help=text)
            parser.addini(ini, text, type="linelist", default=[])
        else:
            group.addoption(flag, dest=f"maskcheck_{name}", default=None, help=text)
            parser.addini(ini, text, default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "maskcheck: a test generated or marked by the maskcheck plugin")


def setting(config: pytest.Config, name: str) -> Any:
    """The value of one setting: command line, then ini key, then [tool.maskcheck], then the default."""
    value = config.getoption(f"maskcheck_{name}")
    if value:
        return value
    ini = config.getini(OPTIONS[name][0])
    if ini:
        return ini
    return _tool_config(config).get(CONFIG_KEYS[name], [] if name == "models" else DEFAULTS.get(name))


def _tool_config(config: pytest.Config) -> dict[str, Any]:
    cached = config.stash.get(_CONFIG_KEY, None)
    if cached is None:
        from .config import ConfigError, load_config

        try:
            cached = load_config(config.rootpath)
        except ConfigError as exc:
            raise pytest.UsageError(f"maskcheck: {exc}") from None
        config.stash[_CONFIG_KEY] = cached
    return cached


_CONFIG_KEY = pytest.StashKey[dict]()
_OPTIONS_KEY = pytest.StashKey[Any]()


def models(config: pytest.Config) -> list[Any]:
    from .testing import ModelEntry

    entries = [ModelEntry.of(spec) for spec in setting(config, "models")]
    for supplied in config.hook.pytest_maskcheck_models(config=config):
        entries.extend(ModelEntry.of(value) for value in supplied or [])
    unique: dict[str, Any] = {}
    for entry in entries:
        unique.setdefault(entry.name, entry)
    return list(unique.values())


def suites(config: pytest.Config) -> list[str]:
    from .registry import suite_names

    chosen = setting(config, "suites")
    if isinstance(chosen, str):
        chosen = [part.strip() for part in chosen.split(",") if part.strip()]
    known = suite_names()
    unknown = [name for name in chosen or [] if name not in known]
    if unknown:
        raise pytest.UsageError(f"maskcheck: unknown suite(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return list(chosen) if chosen else known


def run_options(config: pytest.Config) -> Any:
    cached = config.stash.get(_OPTIONS_KEY, None)
    if cached is None:
        from .testing import RunOptions

        tool = _tool_config(config)
        cached = RunOptions(
            profile=setting(config, "profile"),
            device=setting(config, "device"),
            dtype=setting(config, "dtype"),
            examples=tool.get("examples"),
            seed=tool.get("seed", 0),
            report_dir=Path(config.rootpath, setting(config, "report_dir")),
            timeout=tool.get("timeout"),
            known_findings=tool.get("known_findings", ()),
            tolerance=tool.get("tolerance"),
        )
        config.stash[_OPTIONS_KEY] = cached
    return cached


class MaskcheckItem(pytest.Item):
    """One suite against one model."""

    def __init__(self, *, entry: Any, suite: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry
        self.suite = suite
        self.add_marker("maskcheck")

    def runtest(self) -> None:
        from .testing import _SESSION_CACHE, run_suite_test

        options = run_options(self.config)
        adapter = _SESSION_CACHE.get(self.entry, options)
        run_suite_test(adapter, self.suite, options, self, self.entry.slug)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from .testing import MaskcheckFailure

        if isinstance(excinfo.value, MaskcheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"maskcheck {self.suite} on {self.entry.name}"


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
    if not config.getoption("maskcheck_models") and config.args_source == pytest.Config.ArgsSource.ARGS:
        return  # `pytest some/path` runs that path; models from configuration join full runs only
    entries = models(config)
    if not entries:
        return
    for entry in entries:
        for suite in suites(config):
            name = f"test_maskcheck[{suite}-{entry.name}]"
            items.append(MaskcheckItem.from_parent(session, name=name, nodeid=f"maskcheck::{name}", entry=entry, suite=suite))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``maskcheck_adapter`` in a test's arguments: one test per configured model."""
    if "maskcheck_adapter" in metafunc.fixturenames:
        entries = models(metafunc.config)
        metafunc.parametrize("maskcheck_adapter", entries, ids=[e.name for e in entries], indirect=True, scope="session")


@pytest.fixture(scope="session")
def maskcheck_adapter(request: pytest.FixtureRequest) -> Any:
    """The adapter of a configured model (``--maskcheck-model``, ``maskcheck_models`` or the hook), built once per session."""
    from .testing import _SESSION_CACHE, MaskcheckFailure

    try:
        return _SESSION_CACHE.get(request.param, run_options(request.config))
    except MaskcheckFailure as failure:
        pytest.fail(str(failure), pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On the controller (or a run without xdist), merge each model's per-suite results into
    ``<report_dir>/<model>/report.json`` and ``report.md``."""
    if hasattr(session.config, "workerinput") or not models(session.config):
        return
    merge_reports(run_options(session.config).report_dir)


def merge_reports(report_dir: Path) -> None:
    from .report import render_markdown, write_atomically, write_json

    if not report_dir.is_dir():
        return
    for results in sorted(report_dir.glob("*/results")):
        parts = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
        if not parts:
            continue
        merged = dict(parts[0])
        merged["suites"] = [suite for part in parts for suite in part["suites"]]
        merged["complete"], merged["not_run"] = True, []
        write_json(results.parent / "report.json", merged)
        write_atomically(results.parent / "report.md", render_markdown(merged))
