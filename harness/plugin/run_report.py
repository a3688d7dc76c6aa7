"""One pytest run's maskcheck reports: what was configured, selected and finished.

Each maskcheck test writes ``<report_dir>/<model>/results/<suite>.json`` tagged with the
run's id (pytest-xdist workers never write the same file). At the end of the run the
controller merges this run's files, and only those, into ``report.json`` and
``report.md`` per model, and removes what earlier runs left there under maskcheck's own
names: result files of other runs, ``repro-*`` bundles (directories holding a
``case.json``) and ``*-effective-mask.png`` pictures that this run's results do not name.
A configured model this run did not audit keeps its bundles and pictures: a run of one's
own tests, or of a reproduction bundle itself (``pytest maskcheck-report/<model>/repro-causal``),
must never delete the bundle being debugged; its ``report.json`` is marked ``stale`` (which
run wrote it, which run did not audit it) and no longer says ``complete``. Every report
carries the run's id and start time. The report directory gets a ``.gitignore`` that
ignores it, as pytest's cache does, unless it has one. Nothing else in the report
directory is touched, whatever that directory is.

``complete`` is true only when every maskcheck test selected in this run finished and
the run was not interrupted or stopped early.
"""

from __future__ import annotations

import datetime
import json
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

RESULTS = "results"
REPORT_FILES = ("report.json", "report.md")
PICTURE_SUFFIX = "-effective-mask.png"
BUNDLE_PREFIX = "repro-"
NODE_PREFIX = "maskcheck::"


def new_run_id() -> str:
    return uuid.uuid4().hex


def node_id(suite: str, model: str) -> str:
    return f"{NODE_PREFIX}test_maskcheck[{suite}-{model}]"


@dataclass
class RunLedger:
    """What the controller knows of the configured models' tests in one run."""

    run_id: str
    report_dir: Path
    #: configured model name -> (its report directory's name, the suites configured)
    configured: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    collected: bool = True  # False when test paths were given and the models were left out
    selected: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    started: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )

    def not_audited(self) -> dict[str, list[str]]:
        """Configured model -> its configured suites that did not finish in this run."""
        missing = {}
        for model, (_, suites) in self.configured.items():
            left = [s for s in suites if node_id(s, model) not in self.finished]
            if left:
                missing[model] = left
        return missing

    def unfinished(self, slug: str) -> list[str]:
        """Suites selected in this run that did not finish, of the configured model whose report directory is ``slug``."""
        return [
            suite
            for model, (model_slug, suites) in self.configured.items()
            if model_slug == slug
            for suite in suites
            if node_id(suite, model) in self.selected and node_id(suite, model) not in self.finished
        ]

    def summary(self) -> str | None:
        """One line naming every configured model that was not (fully) audited, with why and how to include it."""
        missing = self.not_audited()
        if not missing:
            return None
        parts = []
        for model, suites in missing.items():
            configured = self.configured[model][1]
            what = model if len(suites) == len(configured) else f"{model} ({', '.join(suites)})"
            ids = [node_id(s, model) for s in suites]
            if not self.collected:
                why = "test paths were given: run pytest without paths, or add --maskcheck-always"
            elif any(i in self.selected for i in ids):
                why = "interrupted or stopped before they finished"
            else:
                why = "deselected by -k/-m"
            parts.append((why, what))
        by_reason: dict[str, list[str]] = {}
        for why, what in parts:
            by_reason.setdefault(why, []).append(what)
        reasons = "; ".join(f"{', '.join(models)} [{why}]" for why, models in by_reason.items())
        count = len(missing)
        return f"maskcheck: {count} configured model{'s' if count > 1 else ''} NOT audited: {reasons}"


def write_result(model_dir: Path, suite: str, result: dict[str, Any], run_id: str) -> None:
    from ..report.render import write_json

    write_json(model_dir / RESULTS / f"{suite}.json", {**result, "run_id": run_id})


def merge_run(ledger: RunLedger, run_complete: bool) -> list[Path]:
    """Merge this run's results per model, remove stale artifacts; returns the reports written."""
    from ..report.render import keep_out_of_git

    keep_out_of_git(ledger.report_dir)
    written = []
    for model_dir, parts in _model_dirs(ledger):
        if not parts:
            _mark_stale(model_dir, ledger)  # its bundles stay: another run's to replace
            continue
        referenced = {
            Path(p).name
            for part in parts
            for s in part["suites"]
            for p in (s.get("reproduction"), s.get("picture"))
            if p
        }
        referenced |= set(REPORT_FILES)  # rewritten below, atomically
        for path in _stale(model_dir, referenced, ledger.run_id):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        written.append(_write_merged(model_dir, parts, ledger, run_complete))
        results = model_dir / RESULTS
        for path in results.glob("*.json"):  # merged now: only this run's were left
            path.unlink()
        if results.is_dir() and not any(results.iterdir()):
            results.rmdir()
    return written


def _write_merged(model_dir: Path, parts: list[dict[str, Any]], ledger: RunLedger, run_complete: bool) -> Path:
    from ..report.render import render_markdown, write_atomically, write_json

    not_run = ledger.unfinished(model_dir.name)
    merged = dict(parts[0])
    merged["run_id"], merged["started"] = ledger.run_id, ledger.started
    merged["suites"] = [suite for part in parts for suite in part["suites"]]
    merged["complete"] = run_complete and not not_run
    merged["not_run"] = not_run
    write_json(model_dir / "report.json", merged)
    write_atomically(model_dir / "report.md", render_markdown(merged))
    return model_dir / "report.json"


def _mark_stale(model_dir: Path, ledger: RunLedger) -> None:
    """A configured model's report from an earlier run, marked as not this run's: it no longer
    reads as current (``complete`` false, ``stale`` saying which runs)."""
    from ..report.render import render_markdown, write_atomically, write_json

    name = next((model for model, (slug, _) in ledger.configured.items() if slug == model_dir.name), None)
    report = _read(model_dir / "report.json")
    if name is None or not report or report.get("run_id") == ledger.run_id:
        return
    report["stale"] = (
        f"the latest run ({ledger.run_id}, started {ledger.started}) did not audit {name}; this report is from run "
        f"{report.get('run_id', 'unknown')} (started {report.get('started', 'unknown')})"
    )
    report["complete"] = False
    write_json(model_dir / "report.json", report)
    write_atomically(model_dir / "report.md", render_markdown(report))


def _model_dirs(ledger: RunLedger) -> Iterator[tuple[Path, list[dict[str, Any]]]]:
    """Each model directory this run wrote to or configured, with this run's result files."""
    if not ledger.report_dir.is_dir():
        return
    names = {slug for slug, _ in ledger.configured.values()}
    names |= {path.parent.parent.name for path in ledger.report_dir.glob(f"*/{RESULTS}/*.json")}
    for name in sorted(names):
        model_dir = ledger.report_dir / name
        if model_dir.is_dir():
            parts = [
                data
                for data in map(_read, sorted(model_dir.glob(f"{RESULTS}/*.json")))
                if data.get("run_id") == ledger.run_id
            ]
            yield model_dir, parts


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stale(model_dir: Path, referenced: set[str], run_id: str) -> Iterator[Path]:
    """maskcheck's own files in ``model_dir`` that this run did not write or name."""
    for path in model_dir.glob(f"{RESULTS}/*.json"):
        if _read(path).get("run_id") != run_id:
            yield path
    for path in model_dir.iterdir():
        if path.name in referenced:
            continue
        if path.is_dir() and path.name.startswith(BUNDLE_PREFIX) and (path / "case.json").is_file():
            yield path
        elif path.is_file() and (path.name.endswith(PICTURE_SUFFIX) or path.name in REPORT_FILES):
            yield path
