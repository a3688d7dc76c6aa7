"""Statuses, check results and suite results, as in docs/design.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "warn", "not_applicable", "error", "not_run"]

# Worst first: a suite's status is the worst of its checks.
SEVERITY: dict[str, int] = {"fail": 5, "error": 4, "not_run": 3, "warn": 2, "pass": 1, "not_applicable": 0}
FAILING = frozenset({"fail", "error", "not_run"})


def checks_run(checks: list[Any]) -> int:
    """How many of ``checks`` ran (every status but ``not_applicable``)."""
    return sum(c.status != "not_applicable" for c in checks)


def worst(statuses: list[str]) -> str:
    return max(statuses, key=SEVERITY.__getitem__) if statuses else "not_applicable"


@dataclass
class CheckResult:
    name: str
    status: Status
    message: str = ""
    max_diff: float | None = None
    floor: float | None = None
    threshold: float | None = None
    positions: list[list[int]] = field(default_factory=list)  # pairs that changed, as positions_label says
    case: dict[str, Any] | None = None  # the (shrunk) case that showed it
    hypothesis_blob: str | None = None  # Hypothesis's @reproduce_failure line (ci/thorough); not stable across versions
    positions_label: str = "row, position"  # "output, input" for an influence pattern
    table: list[dict[str, Any]] = field(default_factory=list)  # rows the report shows as a table
    caveat: str | None = None  # the explanation the message ends with, by name (harness/engine/cases.py: CAVEATS)
    convention: str | None = None  # which of several correct conventions it measured the model to follow
    verified: str | None = None  # the declared pattern it verified (with its window, chunk or prefix)
    # The call paths it ran on (harness/adapters/paths.py), canonical first: each
    # {"path", "status", "cases"} or {"path", "status": "not_run", "reason"} for one that cannot run.
    paths: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("max_diff", "floor", "threshold"):
            if data[key] is not None and not math.isfinite(data[key]):
                data[key] = None  # JSON has no inf; the message says NaN/inf
        return data


@dataclass
class SuiteResult:
    name: str
    checks: list[CheckResult] = field(default_factory=list)
    cases: int = 0
    seconds: float = 0.0
    reproduction: str | None = None
    picture: str | None = None
    reason: str = ""  # why the whole suite did not apply or did not run

    @property
    def status(self) -> str:
        if not self.checks:
            return "not_applicable"
        return worst([c.status for c in self.checks])

    @property
    def checks_run(self) -> int:
        return checks_run(self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "checks_run": self.checks_run,
            "cases": self.cases,
            "seconds": round(self.seconds, 3),
            "checks": [c.to_dict() for c in self.checks],
            "reproduction": self.reproduction,
            "picture": self.picture,
        }

    def worst_check(self) -> CheckResult | None:
        return max(self.checks, key=lambda c: SEVERITY[c.status], default=None)

    def largest_diff_check(self) -> CheckResult | None:
        """The check whose measured difference is largest against its threshold (the table's
        "worst diff" column), among checks that measured one."""
        return max((c for c in self.checks if c.max_diff is not None and c.threshold), key=diff_ratio, default=None)


def diff_ratio(check: Any) -> float:
    """measured / threshold; NaN and inf (a non-finite output) rank above every number."""
    ratio = check.max_diff / check.threshold
    return math.inf if math.isnan(ratio) else ratio
