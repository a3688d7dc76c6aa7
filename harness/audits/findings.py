"""Known findings and architecture conventions: failures reported as ``warn`` with their reason.

A known finding is a failure a project accepted (``[tool.maskcheck] known_findings``), until
it expires. A convention is a documented behaviour of an architecture that a suite would
otherwise report as a bug (``conventions.json``, shipped): it applies only to the named
classes, and only when the check's own measurement shows that behaviour.
"""

from __future__ import annotations

import datetime
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..engine.verdict import SuiteResult
from .config import KnownFinding

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
                check.message = (
                    f"accepted finding expired on {finding.expires} ({finding.reason}); failing again: {check.message}"
                )


CONVENTIONS_FILE = Path(__file__).with_name("conventions.json")


@lru_cache(maxsize=1)
def conventions() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(CONVENTIONS_FILE.read_text())["conventions"])


def apply_conventions(architecture: str | None, suites: Iterable[SuiteResult], disabled: Sequence[str] = ()) -> None:
    """Turn each failing check that a convention of ``architecture`` explains into ``warn``."""
    if not architecture:
        return
    active = [c for c in conventions() if architecture in c["architectures"] and c["id"] not in disabled]
    for suite in suites:
        for check in suite.checks:
            convention = next(
                (
                    c
                    for c in active
                    if (c["suite"], c["check"]) == (suite.name, check.name) and c["evidence"] in check.message
                ),
                None,
            )
            if check.status == "fail" and convention is not None:
                check.status = "warn"
                check.message = f"documented convention of {architecture} ({convention['id']}): {convention['reason']} [{convention['where']}]. Measured: {check.message}"
