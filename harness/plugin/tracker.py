"""The run's bookkeeping on the controller (or a run without xdist): which maskcheck tests
were selected and finished, the reports merged at the end, the summary line of configured
models left unaudited, and ``require`` failing the run."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .items import CompareItem, MaskcheckItem
from .settings import collects_configured, models, pairs, require_applies, run_options, suites


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
