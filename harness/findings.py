"""Known findings: failures a project has accepted, reported as ``warn`` until they expire."""

from __future__ import annotations

import datetime
from typing import Iterable

from .config import KnownFinding
from .verdict import SuiteResult

ACCEPTABLE = ("fail", "error")


def apply_known_findings(
    model: str, suites: Iterable[SuiteResult], findings: Iterable[KnownFinding], today: datetime.date | None = None
) -> None:
    """Turn each failing check that matches an unexpired finding into ``warn``; an expired
    finding leaves the failure standing and says so in its message."""
    today = today or datetime.date.today()
    findings = list(findings)
    for suite in suites:
        for check in suite.checks:
            if check.status not in ACCEPTABLE:
                continue
            finding = next((f for f in findings if f.matches(model, suite.name, check.name)), None)
            if finding is None:
                continue
            if finding.expires >= today:
                check.status = "warn"
                check.message = f"accepted finding until {finding.expires} ({finding.reason}): {check.message}"
            else:
                check.message = f"accepted finding expired on {finding.expires} ({finding.reason}); failing again: {check.message}"
