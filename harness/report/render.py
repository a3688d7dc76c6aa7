"""Reports a person reads: the verdict table of the CLI and the Markdown report of ``--report``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..engine.verdict import SEVERITY, checks_run, diff_ratio, worst

STATUS_MARK = {
    "pass": "PASS",
    "fail": "FAIL",
    "warn": "WARN",
    "not_applicable": "n/a",
    "error": "ERROR",
    "not_run": "NOT RUN",
}
SCHEMA_FILE = Path(__file__).with_name("report.schema.json")


def one_line(text: str, width: int | None = 110) -> str:
    """``text`` on one line, cut to ``width`` characters (None: never cut)."""
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 3] + "..."


def status_text(status: str, checks: list[Any]) -> str:
    """A suite's status as its line shows it: ``PASS``, or ``PASS 1/3`` where one of its three
    checks ran and the others were not applicable, so a line never stands on checks that did
    not run without saying so. A suite none of whose checks ran is ``n/a``."""
    ran = checks_run(checks)
    if status == "not_applicable" or ran == len(checks):
        return STATUS_MARK[status]
    return f"{STATUS_MARK[status]} {ran}/{len(checks)}"


def untested_text(checks: list[Any]) -> str:
    """What a passing suite did not test: ``n/a: incremental (why), greedy_generation (why)``."""
    skipped = [f"{c.name} ({c.message})" if c.message else c.name for c in checks if c.status == "not_applicable"]
    return "n/a: " + ", ".join(skipped) if skipped else ""


def suite_reason(status: str, checks: list[Any]) -> str:
    """The reason on a suite's line: its worst check's message, or for a pass the checks that
    did not run and why."""
    if status == "pass":
        by_convention: dict[str, list[str]] = {}  # a convention several checks share is said once
        for check in checks:
            if getattr(check, "convention", None):
                by_convention.setdefault(check.convention, []).append(check.name)
        conventions = [f"{', '.join(names)}: {convention}" for convention, names in by_convention.items()]
        parts = [f"verified {c.verified}" for c in checks if getattr(c, "verified", None)]
        parts += ["convention: " + "; ".join(conventions)] if conventions else []
        return "; ".join(parts + [untested] if (untested := untested_text(checks)) else parts)
    worst_check = max(checks, key=lambda c: SEVERITY[c.status], default=None)
    return "" if worst_check is None else worst_check.message


def diff_text(check: Any) -> str:
    if check is None or check.max_diff is None or not check.threshold:
        return ""
    return f"{check.max_diff:.3g} / {check.threshold:.3g}"


def paths_text(check: Any) -> str:
    """The call paths a check ran on, one word each: ``canonical PASS 9, training FAIL 3,
    mask_of_ones PASS 0+2 same, default_cache n/a`` (``+2 same``: two replayed cases whose
    calls the path leaves as they were, so their canonical outcome is theirs there)."""
    words = []
    for run in getattr(check, "paths", None) or []:
        if run.get("reason"):
            words.append(f"{run['path']} n/a")
        else:
            words.append(f"{run['path']} {STATUS_MARK[run['status']]} {run_cases(run)}")
    return ", ".join(words)


def run_cases(run: dict[str, Any]) -> str:
    """A path's cases: ``3``, or ``1+2 same`` where two replayed cases made only the canonical calls."""
    same = f"+{run['same_calls']} same" if run.get("same_calls") else ""
    return f"{run.get('cases') or 0}{same}"


def path_lines(environment: dict[str, Any]) -> list[str]:
    """The call paths of an audit: the ones that ran, then each that could not with its reason."""
    paths = environment.get("paths") or []
    if not paths:
        return []
    ran = [p["path"] for p in paths if not p.get("unavailable")]
    lines = [f"  call paths: {', '.join(ran)}"]
    lines += [f"  call path {p['path']} not run: {p['unavailable']}" for p in paths if p.get("unavailable")]
    return lines


def render_table(result: Any, title: str, seconds: float, verbose: bool = False) -> str:
    """The verdict table: suite, status, cases, worst diff vs threshold, one-line reason."""
    width = None if verbose else 110  # -v shows whole reasons: the advice is at their end
    rows = [("suite", "status", "cases", "worst diff / threshold", "reason")]
    for suite in result.suites:
        reason = suite_reason(suite.status, suite.checks)
        rows.append(
            (
                suite.name,
                status_text(suite.status, suite.checks),
                str(suite.cases),
                diff_text(suite.largest_diff_check()),
                one_line(reason, width),
            )
        )
        if verbose:
            for c in suite.checks:
                rows.append((f"  {c.name}", STATUS_MARK[c.status], "", diff_text(c), one_line(c.message, width)))
                if getattr(c, "paths", None):
                    rows.append(("", "", "", "", f"paths: {paths_text(c)}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"maskcheck audit of {title}"]
    if result.environment.get("wrapper"):
        lines.append(f"  {result.environment['wrapper']}")
    for r in rows:
        lines.append(("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4]).rstrip())
    lines += path_lines(result.environment)
    failing = [(s.name, c) for s in result.suites for c in s.checks if c.status in ("fail", "error")]
    for suite_name, c in failing:  # every one: a failure the table names but never explains helps nobody
        lines.append(f"  {suite_name}/{c.name}: {one_line(c.message, None if verbose else 200)}")
        lines += case_lines(c)
    lines += [
        f"  reproduction of {suite.name}: {how_to_reproduce(suite.reproduction)}"
        for suite in result.suites
        if suite.reproduction
    ]
    for probe in result.probes:
        summary = probe["summary"]
        if "error" in summary:
            lines.append(f"  probe {probe['name']}: {summary['error']}")
        else:
            measured = {
                k: summary[k]
                for k in ("accuracy", "effective_length", "reach", "edge_vs_middle", "closed_book_accuracy")
                if k in summary
            }
            lines.append(
                f"  probe {probe['name']}: "
                + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in measured.items())
                + (f"; picture {probe['picture']}" if probe.get("picture") else "")
            )
    lines.append(f"verdict: {STATUS_MARK[result.status]} in {seconds:.1f}s (exit {result.exit_code})")
    return "\n".join(lines)


def case_lines(check: Any, indent: str = "    ") -> list[str]:
    """The shrunk case of a check and, under ci/thorough, Hypothesis's @reproduce_failure line."""
    lines = []
    if check.case and set(check.case) - {"seed"}:  # a case that is only a seed has no structure to show
        lines.append(f"{indent}shrunk case: {check.case}")
    if check.hypothesis_blob:  # for the curious: replay uses the bundle, which survives Hypothesis upgrades
        blob = re.search(r"@reproduce_failure\([^)]*\)", check.hypothesis_blob)
        lines.append(f"{indent}hypothesis: {blob.group(0) if blob else check.hypothesis_blob.strip()}")
    return lines


def how_to_reproduce(bundle: str) -> str:
    return f"pytest {bundle}   (or: maskcheck replay {bundle})"


def render_markdown(report: dict[str, Any]) -> str:
    """``report.md`` from a JSON report: environment, the verdict table, then every check
    that did not pass (with measured, floor and threshold), pictures and reproductions."""
    status = worst([s["status"] for s in report["suites"]] + ([] if report.get("complete", True) else ["not_run"]))
    lines = [
        f"# maskcheck audit of `{report['model']}`",
        "",
        f"**Verdict: {STATUS_MARK[status]}**"
        + ("" if report.get("complete", True) else f" (did not run: {', '.join(report.get('not_run', []))})"),
        "",
        *([f"> **Stale:** {report['stale']}", ""] if report.get("stale") else []),
        *([f"Run `{report['run_id']}`, started {report.get('started', '?')}.", ""] if report.get("run_id") else []),
        "| environment | |",
        "|---|---|",
        *[f"| {key} | {value} |" for key, value in report["environment"].items() if key != "paths"],
        "",
        *path_matrix(report),
        "| suite | status | cases | worst diff / threshold | reason |",
        "|---|---|---|---|---|",
    ]
    details = []
    for suite in report["suites"]:
        checks = [_Check(c) for c in suite["checks"]]
        largest = max((c for c in checks if c.max_diff is not None and c.threshold), key=diff_ratio, default=None)
        reason = one_line(suite_reason(suite["status"], checks), 160)
        lines.append(
            f"| {suite['name']} | {status_text(suite['status'], checks)} | {suite['cases']} | {diff_text(largest)} | {reason.replace('|', chr(92) + '|')} |"
        )
        details += [
            (suite, c) for c in checks if c.status not in ("pass", "not_applicable") or getattr(c, "table", None)
        ]
    if details:
        lines += ["", "## Checks that did not pass, and evidence tables", ""]
    for suite, check in details:
        lines += [f"### {suite['name']} / {check.name}: {STATUS_MARK[check.status]}", "", check.message, ""]
        if check.max_diff is not None and check.threshold:
            lines += [
                f"- measured {check.max_diff:.3g}, noise floor {check.floor or 0:.3g}, threshold {check.threshold:.3g}"
            ]
        if check.positions:
            more = f" ... ({len(check.positions)} in all)" if len(check.positions) > 16 else ""
            lines += [
                f"- positions [{getattr(check, 'positions_label', 'row, position')}]: {check.positions[:16]}{more}"
            ]
        if check.case:
            lines += [f"- case: `{check.case}`"]
        if getattr(check, "table", None):
            columns = list(check.table[0])
            lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(str(row.get(column, "")) for column in columns) + " |" for row in check.table]
        lines.append("")
    for probe in report.get("probes", []):
        lines += [f"## Probe: {probe['name']}", "", "| measure | value |", "|---|---|"]
        lines += [
            f"| {key} | {f'{value:.3g}' if isinstance(value, float) else value} |"
            for key, value in probe["summary"].items()
            if not isinstance(value, (dict, list))
        ]
        if probe.get("picture"):
            lines += ["", f"![{probe['name']}]({os.path.basename(probe['picture'])})"]
        lines.append("")
    for suite in report["suites"]:
        if suite.get("picture"):
            lines += [f"![{suite['name']} effective mask]({os.path.basename(suite['picture'])})", ""]
        if suite.get("reproduction"):
            lines += [
                f"Reproduce `{suite['name']}`: `pytest {suite['reproduction']}` or `maskcheck replay {suite['reproduction']}`",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def path_matrix(report: dict[str, Any]) -> list[str]:
    """The path matrix of a JSON report: a row per check, a column per call path, each cell
    the status and cases run there (``n/a`` where the path cannot run, with the reasons below)."""
    paths = report["environment"].get("paths") or []
    if not paths:
        return []
    names = [p["path"] for p in paths]
    lines = ["## Call paths", "", "| check | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for suite in report["suites"]:
        for check in suite["checks"]:
            runs = {run["path"]: run for run in check.get("paths") or []}
            if not runs:
                continue
            cells = []
            for name in names + [n for n in runs if n not in names]:
                run = runs.get(name)
                if run is None:
                    cells.append("")
                elif run.get("reason"):
                    cells.append("n/a")
                else:
                    cells.append(f"{STATUS_MARK[run['status']]} ({run_cases(run)})")
            lines.append(f"| {suite['name']}/{check['name']} | " + " | ".join(cells[: len(names)]) + " |")
            extra = [f"{n}: {cells[len(names) + i]}" for i, n in enumerate(n for n in runs if n not in names)]
            if extra:
                lines[-1] += " " + "; ".join(extra)
    lines.append("")
    lines += [f"- **{p['path']}**: {p['description']}" + (f" — not run: {p['unavailable']}" if p.get("unavailable") else "")
              for p in paths]  # fmt: skip
    return lines + [""]


class _Check:
    """A check of a JSON report, read by attribute like a CheckResult."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.__dict__.update(data)


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and a rename: a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


GITIGNORE = "# written by maskcheck: reports and reproduction bundles of this machine's runs\n*\n"


def keep_out_of_git(directory: str | Path) -> None:
    """Give a report directory a ``.gitignore`` that ignores it all, as pytest does for its
    cache, unless it has one already (the user's own, kept as it is)."""
    directory = Path(directory)
    if directory.is_dir() and not (directory / ".gitignore").exists():
        (directory / ".gitignore").write_text(GITIGNORE)


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomically(path, json.dumps(data, indent=2, default=str) + "\n")


def report_schema() -> dict[str, Any]:
    """The JSON Schema every report validates against (shipped as package data)."""
    return json.loads(SCHEMA_FILE.read_text())
