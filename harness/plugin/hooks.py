"""The maskcheck pytest plugin (entry point ``pytest11``).

``pytest --maskcheck-model SPEC`` (repeatable) adds one test per suite per model,
``maskcheck::test_maskcheck[SUITE-SPEC]``, so ``-k causal`` or ``-k "hf:./ckpt"`` select
them. Collection never builds a model; a suite that does not apply is skipped with its
reason; ``warn`` becomes a :class:`maskcheck.harness.plugin.testing.MaskcheckWarning`; a failure prints the
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
| ``--maskcheck-threads`` | ``maskcheck_threads`` | ``auto``: a fair share of the cores per worker (maskcheck.harness.plugin.threads) |
| ``--maskcheck-always`` | ``maskcheck_always`` | off: ``pytest PATH`` runs only that path |
| ``--maskcheck-require`` | ``maskcheck_require`` | off: a configured model left unaudited is one red summary line, not an error |

``[[tool.maskcheck.compare]]`` pairs (``a``, ``b``, ``weights``, ``map``, ``suites``; see
:class:`maskcheck.harness.audits.config.ComparePair`) add one test each,
``maskcheck::test_maskcheck[compare-A-vs-B]``: ``maskcheck compare A B`` under the run's
profile, device and dtype, failing where B parts from A, with its reproductions in the
report directory's ``compare-A-vs-B/``.

Configured models and pairs join runs without test paths (``pytest``, ``pytest -n auto``). When a
run names paths (``pytest tests/``) they are left out unless ``--maskcheck-always``; the
terminal summary then says, in one red line, which configured models were not audited
and why (paths, ``-k``/``-m``, an interrupted run); ``--maskcheck-require`` makes that a
failing exit status.

This module imports nothing heavy at load time: a repo with maskcheck installed that does
not use it pays only for this file. torch and transformers load when a maskcheck test runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ..engine.profile_names import PROFILE_NAMES

OPTIONS = {
    # option name: (ini key, help)
    "models": ("maskcheck_models", "model spec to audit; one test per suite (repeatable)"),
    "suites": ("maskcheck_suites", "comma-separated suites (default: every suite)"),
    "profile": ("maskcheck_profile", "quick, dev, ci or thorough (default: ci)"),
    "device": ("maskcheck_device", "cpu, cuda, cuda:N or auto (default: cpu)"),
    "dtype": ("maskcheck_dtype", "float32, bfloat16 or float16 (default: the model's own)"),
    "report_dir": ("maskcheck_report_dir", "reports and reproduction bundles (default: maskcheck-report)"),
    "threads": (
        "maskcheck_threads",
        "torch threads per test process: auto (cores / xdist workers, unless OMP_NUM_THREADS is set), keep, or N",
    ),
    "paths": (
        "maskcheck_paths",
        "comma-separated call paths each check also runs on (default: every path the model can take; canonical: none)",
    ),
}
#: on/off settings: a flag, or an ini key set to true
FLAGS = {
    "always": ("maskcheck_always", "audit the configured models even when test paths are given"),
    "require": (
        "maskcheck_require",
        "fail the run when a configured model is not audited (paths, -k/-m, interruption)",
    ),
}
DEFAULT_REPORT_DIR = "maskcheck-report"
DEFAULTS = {
    "profile": "ci",
    "device": "cpu",
    "dtype": None,
    "report_dir": DEFAULT_REPORT_DIR,
    "suites": None,
    "threads": "auto",
    "paths": None,
}
CHOICES = {"profile": PROFILE_NAMES, "dtype": ("float32", "bfloat16", "float16")}
#: [tool.maskcheck] keys for the same settings
CONFIG_KEYS = {
    "models": "models",
    "suites": "suites",
    "profile": "profile",
    "device": "device",
    "dtype": "dtype",
    "report_dir": "report",
    "threads": "threads",
    "paths": "paths",
    "always": "always",
    "require": "require",
}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("maskcheck", "maskcheck: masking and caching invariance suites")
    for name, (ini, text) in OPTIONS.items():
        option = "--maskcheck-model" if name == "models" else f"--maskcheck-{name.replace('_', '-')}"
        if name == "models":
            group.addoption(option, action="append", dest="maskcheck_models", default=[], metavar="SPEC", help=text)
            parser.addini(ini, text, type="linelist", default=[])
        else:
            group.addoption(option, dest=f"maskcheck_{name}", default=None, help=text)
            parser.addini(ini, text, default=None)
    for name, (ini, text) in FLAGS.items():
        group.addoption(f"--maskcheck-{name}", action="store_true", dest=f"maskcheck_{name}", default=False, help=text)
        parser.addini(ini, text, type="bool", default=False)


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


def flag(config: pytest.Config, name: str) -> bool:
    """An on/off setting: the command line, the ini key or ``[tool.maskcheck]``."""
    return bool(
        config.getoption(f"maskcheck_{name}") or config.getini(FLAGS[name][0]) or _tool_config(config).get(name)
    )


def require_applies(config: pytest.Config) -> bool:
    """Whether ``require`` may fail this run: ``--maskcheck-require`` on the command line
    always (what CI passes), else a configured ``require`` for runs meant to audit, the ones
    given no test paths or node ids, no ``-k`` and no ``-m``. ``--collect-only`` never fails
    because of it, nor does a targeted run (an IDE's, ``pytest tests/test_x.py::test_one``)."""
    if config.getoption("collectonly"):
        return False
    if config.getoption("maskcheck_require"):
        return True
    if not (config.getini(FLAGS["require"][0]) or _tool_config(config).get("require")):
        return False
    targeted = config.args_source == pytest.Config.ArgsSource.ARGS
    return not (targeted or config.getoption("keyword") or config.getoption("markexpr"))


def validate_settings(config: pytest.Config) -> None:
    """Every setting checked once, up front: one usage error instead of one per test."""
    from .threads import ThreadSettingError, parse_threads

    tool = _tool_config(config)
    both = [
        f"{ini} in [tool.pytest.ini_options] and {key} in [tool.maskcheck]"
        for name, key in CONFIG_KEYS.items()
        for ini in [OPTIONS[name][0] if name in OPTIONS else FLAGS[name][0]]
        if key in tool and _ini_set(config, ini)
    ]
    if both:
        raise pytest.UsageError(f"maskcheck: set each setting in one place, not both: {'; '.join(both)}")

    for name, allowed in CHOICES.items():
        value = setting(config, name)
        if value is not None and value not in allowed:
            raise pytest.UsageError(f"maskcheck: {OPTIONS[name][0]} = {value!r} is not one of {', '.join(allowed)}")
    try:
        parse_threads(setting(config, "threads"))
    except ThreadSettingError as exc:
        raise pytest.UsageError(f"maskcheck: {exc}") from None
    call_paths(setting(config, "paths"))
    chosen_suites(config)


def _ini_set(config: pytest.Config, ini: str) -> bool:
    """Whether the ini file sets ``ini`` to something (its default is nothing, or false)."""
    return bool(config.getini(ini))


def new_ledger(config: pytest.Config) -> Any:
    from . import testing
    from .run_report import RunLedger
    from .testing import compare_slug

    chosen = suites(config)
    ledger = RunLedger(testing.RUN_ID, run_options(config).report_dir, collected=collects_configured(config))
    ledger.configured = {entry.name: (entry.slug, chosen) for entry in models(config)}
    for pair in pairs(config):  # its test is node_id("compare", name): said in the summary when left out
        ledger.configured[pair.name] = (compare_slug(pair), ["compare"])
    return ledger


def collects_configured(config: pytest.Config) -> bool:
    """``[[tool.maskcheck.compare]]`` pairs (``a``, ``b``, ``weights``, ``map``, ``suites``; see
    :class:`maskcheck.harness.audits.config.ComparePair`) add one test each,
    ``maskcheck::test_maskcheck[compare-A-vs-B]``: ``maskcheck compare A B`` under the run's
    profile, device and dtype, failing where B parts from A, with its reproductions in the
    report directory's ``compare-A-vs-B/``.

    Configured models and pairs join runs without test paths, or any run with --maskcheck-model/--maskcheck-always."""
    if config.getoption("maskcheck_models") or flag(config, "always"):
        return True
    return config.args_source != pytest.Config.ArgsSource.ARGS


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
        import warnings

        from ..audits.config import ConfigError, ConfigWarning, load_config

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConfigWarning)
                cached = load_config(config.rootpath)
        except ConfigError as exc:
            raise pytest.UsageError(f"maskcheck: {exc}") from None
        config.stash[_CONFIG_KEY] = cached
        for warning in caught:  # into pytest's warnings summary, where a host looks for them
            config.issue_config_time_warning(warning.message, stacklevel=2)
    return cached


_CONFIG_KEY = pytest.StashKey[dict]()
_OPTIONS_KEY = pytest.StashKey[Any]()
_LEDGER_KEY = pytest.StashKey[Any]()


def models(config: pytest.Config) -> list[Any]:
    from .testing import ModelEntry

    entries = [ModelEntry.of(spec) for spec in setting(config, "models")]
    for supplied in config.hook.pytest_maskcheck_models(config=config):
        entries.extend(ModelEntry.of(value) for value in supplied or [])
    unique: dict[str, Any] = {}
    for entry in entries:
        unique.setdefault(entry.name, entry)
    return list(unique.values())


def pairs(config: pytest.Config) -> list[Any]:
    """The configured pairs to compare (``[[tool.maskcheck.compare]]``)."""
    return list(_tool_config(config).get("compare", []))


def chosen_suites(config: pytest.Config) -> list[str]:
    """The suites the settings name, checked against the registered names (no suite is imported)."""
    from ..engine.registry import registered_suite_names, unknown_suites_message

    chosen = setting(config, "suites")
    if isinstance(chosen, str):
        chosen = [part.strip() for part in chosen.split(",") if part.strip()]
    message = unknown_suites_message(chosen or [], registered_suite_names())
    if message:
        raise pytest.UsageError(f"maskcheck: {message}")
    return list(chosen or [])


def suites(config: pytest.Config) -> list[str]:
    """The suites to run: those the settings name, else every registered suite in run order."""
    from ..engine.registry import suite_names

    return chosen_suites(config) or suite_names()


def gate_in_run(config: pytest.Config) -> bool:
    """Whether the suite holding the batching gate is among this run's suites."""
    from ..engine.registry import batching_gate_suite

    gate = batching_gate_suite()
    return gate is not None and gate.name in suites(config)


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
            disabled_conventions=tool.get("disabled_conventions", ()),
            tolerance=tool.get("tolerance"),
            threads=setting(config, "threads"),
            paths=call_paths(setting(config, "paths")),
        )
        config.stash[_OPTIONS_KEY] = cached
    return cached


def call_paths(value: Any) -> tuple[str, ...] | None:
    """``--maskcheck-paths a,b`` (or the ini key, or ``paths = [...]``) as names; None: every path.
    An unknown name is a usage error, before anything runs."""
    if value is None:
        return None
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if n.strip()]
    from ..adapters.paths import PATHS

    unknown = sorted(set(names) - set(PATHS))
    if unknown:
        raise pytest.UsageError(f"maskcheck: unknown call path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    return tuple(names)


class VerdictItem(pytest.Item):
    """A generated maskcheck test: marked ``maskcheck``, and its failure is the verdict text."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker("maskcheck")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from .testing import MaskcheckFailure

        if isinstance(excinfo.value, MaskcheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class MaskcheckItem(VerdictItem):
    """One suite against one model."""

    def __init__(self, *, entry: Any, suite: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry
        self.suite = suite

    def runtest(self) -> None:
        from .testing import _SESSION_CACHE, run_suite_test

        options = run_options(self.config)
        adapter = _SESSION_CACHE.get(self.entry, options)
        run_suite_test(adapter, self.suite, options, self, self.entry.slug, gate_in_run(self.config))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"maskcheck {self.suite} on {self.entry.name}"


class CompareItem(VerdictItem):
    """``maskcheck compare`` of one configured pair, every suite compared in one test."""

    def __init__(self, *, pair: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pair = pair

    def runtest(self) -> None:
        from .testing import run_compare_test

        run_compare_test(self.pair, run_options(self.config))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"maskcheck compare {self.pair.a} {self.pair.b}"


class CollatorItem(VerdictItem):
    """The collator checks of one task against one collator factory."""

    def __init__(self, *, factory: str, task: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factory = factory
        self.task = task

    def runtest(self) -> None:
        from .testing import run_collator_test

        run_collator_test(self.factory, self.task, run_options(self.config))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"maskcheck collator ({self.task}) on {self.factory}"


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
        for factory, task in _tool_config(config).get("collators", [])
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


class RunTracker:
    """On the controller (or a run without xdist): which maskcheck tests this run selected and
    finished, the merged reports at the end, and the summary line of models left unaudited."""

    def __init__(self, config: pytest.Config, ledger: Any) -> None:
        self.config = config
        self.ledger = ledger  # None when no model is configured (only the helper's tests run)
        self.ran_maskcheck = False
        self.required: str | None = None  # why require failed this run
        self.reports: list[dict[str, Any]] = []  # the merged reports this run wrote

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.ledger is not None:  # without xdist this process collected the selected tests
            self.ledger.selected.update(
                item.nodeid for item in session.items if isinstance(item, (MaskcheckItem, CompareItem))
            )

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        from . import testing

        node.workerinput["maskcheck_run_id"] = testing.RUN_ID

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if self.ledger is not None:
            self.ledger.selected.update(i for i in ids if i.startswith("maskcheck::"))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "maskcheck" in report.keywords:
            self.ran_maskcheck = True
            if self.ledger is not None and report.when == "teardown":
                self.ledger.finished.add(report.nodeid)

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes its file at session finish
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from . import testing
        from .run_report import RunLedger, merge_run

        if self.ledger is None and not self.ran_maskcheck:
            return
        ledger = self.ledger or RunLedger(testing.RUN_ID, run_options(self.config).report_dir)
        stopped = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop) or bool(session.shouldfail)
        try:
            self.reports = [json.loads(path.read_text()) for path in merge_run(ledger, run_complete=not stopped)]
        except KeyboardInterrupt:
            # A second Ctrl-C while the reports merge: the run stays pytest's INTERRUPTED (2), not
            # an uncaught interrupt (130); the result files stay for the next run to replace.
            session.exitstatus = pytest.ExitCode.INTERRUPTED
            return
        line = self.ledger.summary() if self.ledger is not None else None
        if line and require_applies(self.config):
            self.required = line
            fail_required(session, line)
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        line = self.ledger.summary() if self.ledger is not None else None
        if line:
            if self.required:
                line += " (require: the run fails)"
            terminalreporter.write_sep("!", line, red=True, bold=True)
        audited = self.audited_line()
        if audited:
            terminalreporter.write_line(audited)

    def audited_line(self) -> str | None:
        """One line on what this run audited: models, suites, verdicts and where the reports are."""
        if not self.reports:
            return None
        verdicts: dict[str, int] = {}
        suites: set[str] = set()
        for report in self.reports:
            for suite in report.get("suites", []):
                suites.add(suite["name"])
                verdicts[suite["status"]] = verdicts.get(suite["status"], 0) + 1
        counted = ", ".join(f"{count} {status}" for status, count in sorted(verdicts.items()))
        where = run_options(self.config).report_dir
        try:
            where = where.relative_to(self.config.rootpath)
        except ValueError:
            pass
        models = len(self.reports)
        return (
            f"maskcheck: audited {models} model{'s' if models > 1 else ''} x {len(suites)} suite"
            f"{'s' if len(suites) > 1 else ''} ({counted}); reports in {where}/"
        )


REQUIRE_NODE = "maskcheck::require"


def fail_required(session: pytest.Session, reason: str) -> None:
    """Report ``maskcheck::require`` as a failed test, so the JUnit file and the counts say
    what failed the run (its setup, call and teardown, as a test's)."""
    location = ("maskcheck", None, "require")
    for when, outcome in (("setup", "passed"), ("call", "failed"), ("teardown", "passed")):
        report = pytest.TestReport(
            REQUIRE_NODE, location, {"maskcheck": 1}, outcome, reason if outcome == "failed" else None, when
        )
        session.config.hook.pytest_runtest_logreport(report=report)
