"""The compare report a person reads: a line per check, the first differing module, the case."""

from __future__ import annotations

from typing import Any

STATUS = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "not_run": "NOT RUN", "not_applicable": "n/a"}


def render_comparison(result: Any) -> str:
    lines = [f"maskcheck compare  A: {result.a}  B: {result.b}"]
    if result.weights is not None:
        w = result.weights
        lines.append(
            f"  weights: A's {w['read']} tensors read, {w['loaded']} loaded into B"
            + (f", {len(w['dropped'])} dropped by the mapping" if w["dropped"] else "")
            + (f", {len(w['tied'])} tied" if w["tied"] else "")
        )
    for said in result.conventions:
        lines.append(f"  conventions differ: {said}")
    for suite in result.suites:
        compared = sum(c.status in ("pass", "fail") for c in suite.checks)
        counted = f" {compared}/{len(suite.checks)}" if suite.status in ("pass", "fail") else ""
        lines.append(f"{suite.name:<16} {STATUS.get(suite.status, suite.status)}{counted}")
        for check in suite.checks:
            lines.append(f"  {check.name:<20} {STATUS.get(check.status, check.status):<8} {check.message}")
            if check.case:
                lines.append(f"  {'':<20} {'':<8} smallest case: {check.case}")
    if result.status not in ("pass", "fail", "error"):
        lines.append(
            "NOTHING COMPARED: no check of these suites made a call on both models; A and B are not shown equal"
        )
    lines.append(f"{STATUS.get(result.status, result.status)} in {result.seconds:.1f} s")
    return "\n".join(lines)
