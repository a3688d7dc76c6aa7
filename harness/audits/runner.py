"""The engine behind every surface: run suites against one adapter and collect verdicts.

One failing suite never stops the others: a model that raises, returns the wrong
shape or misbehaves gives an ``error`` check for that suite, and the audit goes on.
"""

from __future__ import annotations

import copy
import datetime
import platform
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..adapters.base import OUT_OF_MEMORY, Adapter, AdapterError
from ..adapters.paths import CANONICAL, FLOAT32_TWIN, PATHS, TRAINING_BACKWARD, PathAvailability
from ..adapters.specs import LoadOptions, adapter_for, load_adapter
from ..engine.profiles import check_profile, examples_of, path_examples_of
from ..engine.registry import (
    UnknownSuiteError,
    batching_gate_suite,
    load_probe,
    load_suite,
    maskcheck_version,
    suite_names,
)
from ..engine.suite import (
    Check,
    ProbeError,
    RunContext,
    case_to_dict,
    informative_cases,
    replay_first,
    run_check_keeping_cases,
)
from ..engine.tolerance import measure_reference_error, tolerance_for
from ..engine.verdict import FAILING, SEVERITY, CheckResult, SuiteResult, worst
from ..report.reproduction import FailedCheck, write_bundle
from .config import KnownFinding
from .findings import apply_conventions, apply_known_findings
from .rounding import judged_in_float64, near_the_bar

SCHEMA_VERSION = 1

#: called as progress("start", suite name, result so far) before each suite,
#: progress("gate", "padding/batch_composition", result) before the check that decides batching runs,
#: progress("case", "suite/check done/planned", result so far) after each case, and
#: progress("done", suite name, result so far) after the suite
ProgressCallback = Callable[[str, str, "AuditResult"], None]


@dataclass
class AuditResult:
    model: str
    environment: dict[str, Any]
    suites: list[SuiteResult] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    adapter: dict[str, Any] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)  # suites not run yet (an interrupted audit keeps them)
    # Which run wrote this result, and when it started (UTC): a report left by an earlier run says so.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )

    @property
    def status(self) -> str:
        return worst([s.status for s in self.suites] + (["not_run"] if self.pending else []))

    @property
    def exit_code(self) -> int:
        statuses = [s.status for s in self.suites] + (["not_run"] if self.pending else [])
        if any(s in FAILING for s in statuses):
            return 1
        if all(s == "not_applicable" for s in statuses):
            return 2
        return 0

    def suite(self, name: str) -> SuiteResult:
        for result in self.suites:
            if result.name == name:
                return result
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "maskcheck_version": maskcheck_version(),
            "run_id": self.run_id,
            "started": self.started,
            "environment": self.environment,
            "complete": not self.pending,
            "not_run": list(self.pending),
            "suites": [s.to_dict() for s in self.suites],
            "probes": self.probes,
        }


def environment(adapter: Adapter, seed: int, profile: str) -> dict[str, Any]:
    from importlib import metadata

    import torch

    try:  # read from the installed package: importing transformers costs 1.4 s an audit may not need
        transformers_version: str | None = metadata.version("transformers")
    except metadata.PackageNotFoundError:  # pragma: no cover - a dependency, but the engine does not need it
        transformers_version = None
    return {
        "torch": torch.__version__,
        "transformers": transformers_version,
        "python": platform.python_version(),
        "device": adapter.capabilities.device,
        "dtype": adapter.capabilities.dtype,
        "seed": seed,
        "profile": profile,
        "attn_implementation": getattr(adapter, "attn_implementation", None),
        **({"wrapper": adapter.wrapper} if getattr(adapter, "wrapper", None) else {}),
    }


def audit(
    model: Any,
    suites: Sequence[str] | None = None,
    *,
    options: LoadOptions | None = None,
    seed: int = 0,
    profile: str = "dev",
    examples: int | None = None,
    tolerance_overrides: dict[str, dict[str, float]] | None = None,
    report_dir: str | Path | None = None,
    bundle_dir: str | Path | None = None,
    timeout: float | None = None,
    known_findings: Sequence[KnownFinding] = (),
    disabled_conventions: Sequence[str] = (),
    probes: Sequence[str] = (),
    progress: ProgressCallback | None = None,
    batch_cases: bool | None = None,
    paths: Sequence[str] | None = None,
) -> AuditResult:
    """Audit ``model`` (a spec string, a model object or an adapter) with ``suites`` (default: all).

    ``report_dir`` receives the pictures of failing mask suites and, like ``bundle_dir``
    (which defaults to it), one reproduction bundle per failing suite (``repro-<suite>/``).
    ``profile`` is one of maskcheck.harness.engine.profiles.PROFILES; ``examples`` replaces its case count.
    ``timeout`` limits each suite (seconds): checks it cuts short are ``not_run``.
    ``known_findings`` turn matching failures into ``warn`` until they expire; documented
    conventions of the model's architecture (``harness/audits/conventions.json``) do the same,
    except those named in ``disabled_conventions``.
    ``probes`` (``needle``, ``lost-in-the-middle``) run after the suites with their defaults;
    their grids and pictures go to ``report_dir`` when one is given.
    ``batch_cases``: cases of a check share forwards once the model's rows are shown not to
    read each other (:func:`batching_gate`). ``None`` (the default) runs that gate when the
    padding suite is in the run (it is one of its checks) or reuses this adapter's earlier
    gate in this process; ``True`` runs it in any case (the pytest plugin, whose items each
    audit one suite); ``False`` gives every case its own forwards.
    ``paths``: the call paths (harness/adapters/paths.py) every check runs on besides the
    canonical one, by name; None: every path the model can take, each with the profile's
    share of cases (``engine.profiles.PATH_EXAMPLES``); ``()``: the canonical path only.

    Raises :class:`maskcheck.harness.adapters.specs.SpecError` when the model cannot be loaded and
    :class:`maskcheck.harness.engine.registry.UnknownSuiteError` for an unknown suite name.
    """
    adapter = load_adapter(model, options) if isinstance(model, str) else adapter_for(model)
    adapter.forward_memo.clear()  # a memo per audit: the model may have changed since the last one
    names = list(suites) if suites else suite_names()
    loaded = [(name, load_suite(name)) for name in names]  # unknown names fail before any work
    check_profile(profile)
    tolerance = tolerance_for(adapter.capabilities.device, adapter.capabilities.dtype, tolerance_overrides)
    reference_error = measure_reference_error(adapter)
    if reference_error is not None:
        tolerance = replace(tolerance, reference_error=reference_error)
    context = RunContext(
        tolerance=tolerance,
        twin_tolerance=tolerance_for(adapter.capabilities.device, "float32", tolerance_overrides),
        dtype=adapter.capabilities.dtype,
        units=adapter.capabilities.output_kind.units,
        seed=seed,
        examples=examples if examples is not None else examples_of(profile),
        profile=profile,
        paths=other_paths(paths),
        report_dir=Path(report_dir) if report_dir is not None else None,
        bundle_dir=Path(bundle_dir)
        if bundle_dir is not None
        else (Path(report_dir) if report_dir is not None else None),
    )
    result = AuditResult(
        adapter.spec, environment(adapter, seed, profile), adapter=adapter.describe(), pending=[n for n, _ in loaded]
    )
    result.environment["float32_reference_error"] = reference_error
    context.path_examples = path_examples_of(profile, context.examples)
    result.environment["paths"] = path_environment(adapter, context)
    release_unused_twin(adapter, result.environment["paths"])
    decided: dict[tuple[str, str], tuple] = {}
    gate_suite = batching_gate_suite()
    gate_name = f"{gate_suite.name}/{gate_suite.batching_gate}" if gate_suite else ""
    gates = _earlier_gates(adapter)
    gate_key = (seed, profile, context.examples, repr(tolerance))
    if batch_cases is False:
        result.environment["batching"] = "off: every case has forwards of its own (batch_cases=False)"
    elif gate_key in gates:  # this adapter's gate ran in this process (a pytest item per suite)
        context.batch_cases, result.environment["batching"], decided = copy.deepcopy(gates[gate_key])
    elif gate_suite is None:
        result.environment["batching"] = (
            "off: no registered suite holds a batching gate; every case has forwards of its own"
        )
    elif batch_cases is None and gate_suite.name not in names:
        result.environment["batching"] = (
            f"off: the {gate_suite.name} suite, whose {gate_suite.batching_gate} check must pass before cases"
            " share forwards, is not in this run"
        )
    else:

        def on_gate_case(check: str, done: int, planned: int) -> None:
            if progress:
                progress(
                    "case",
                    f"{gate_suite.name}/{check} {done}/{planned} (run first: it decides whether cases share forwards)",
                    result,
                )

        if progress:
            progress("gate", gate_name, result)  # a report on disk before any forward
        gate_context = replace(
            context, deadline=None if timeout is None else time.monotonic() + timeout, on_case=on_gate_case
        )
        context.batch_cases, result.environment["batching"], decided = batching_gate(adapter, gate_context, gate_suite)
        gates[gate_key] = copy.deepcopy((context.batch_cases, result.environment["batching"], decided))
    context.decided = decided
    for name, suite in loaded:
        if progress:
            progress("start", name, result)

        def on_case(check: str, done: int, planned: int, suite: str = name) -> None:
            if progress:
                progress("case", f"{suite}/{check} {done}/{planned}", result)

        suite_context = replace(
            context, deadline=None if timeout is None else time.monotonic() + timeout, on_case=on_case
        )
        suite_result = run_suite(suite, adapter, suite_context)
        apply_known_findings(adapter.spec, [suite_result], known_findings)
        apply_conventions(result.adapter.get("architecture"), [suite_result], disabled_conventions)
        licence_extension(suite, suite_result, context, result.environment, adapter.capabilities.attention)
        result.suites.append(suite_result)
        result.pending.remove(name)
        if progress:
            progress("done", name, result)
    # Measured on the first check that asked for the last positions only: known after the suites.
    result.environment["logits_to_keep"] = adapter.describe_kept_logits()
    memo = adapter.forward_memo
    result.environment["forward_memo"] = (
        f"{memo.hits} call(s) served from earlier identical calls of this audit, {memo.misses} computed"
    )
    for name in probes:
        result.probes.append(_probe(name, adapter, seed, report_dir))
    return result


def _probe(name: str, adapter: Adapter, seed: int, report_dir: str | Path | None) -> dict[str, Any]:
    """One probe's report entry; a probe that cannot run on this model says why instead."""
    try:
        run, draw = load_probe(name)
    except UnknownSuiteError as exc:
        return {"name": name, "summary": {"error": exc.args[0]}, "grid": None, "picture": None}
    try:
        probe = run(adapter, seed=seed)
    except (ProbeError, AdapterError) as exc:
        return {"name": name, "summary": {"error": str(exc)}, "grid": None, "picture": None}
    if report_dir is not None:
        probe.write(report_dir, draw)
    return probe.to_dict()


def _earlier_gates(adapter: Adapter) -> dict[tuple, tuple]:
    """The gates this adapter ran in this process, by (seed, profile, cases, tolerance): kept on
    the adapter, so they live as long as it does (an adapter that takes no attribute keeps none)."""
    try:
        return adapter.__dict__.setdefault("_maskcheck_gates", {})
    except AttributeError:  # pragma: no cover - an adapter with __slots__
        return {}


def batching_gate(
    adapter: Adapter, context: RunContext, gate_suite: type
) -> tuple[bool, str, dict[tuple[str, str], tuple]]:
    """Whether cases may share forwards, the report's line on it, and the check run to decide.

    Stacking rows of several cases in one forward is sound only for a model whose rows do
    not read each other, whatever the other rows hold and however wide the batch is padded:
    what the gate suite's gate check (``Suite.batching_gate``: padding's ``batch_composition``)
    measures. It runs first, alone (its cases one forward each); the suite later reports
    this same result instead of running it again."""
    gate = f"{gate_suite.name}/{gate_suite.batching_gate}"
    suite = gate_suite()
    reason = suite.not_applicable(adapter.capabilities)
    if reason:
        return (
            False,
            f"off: {gate}, which must pass before cases share forwards, cannot run ({reason}); every case has forwards of its own",
            {},
        )
    check = next(
        c for c in suite.checks(adapter, context) if isinstance(c, Check) and c.name == gate_suite.batching_gate
    )
    try:
        # its cases are kept for the call paths, which replay them as they replay any check's
        outcome = run_check_keeping_cases(check, context)
    except Exception as exc:
        outcome = (CheckResult(check.name, "error", _describe(exc)), 0, None, [])
    status = outcome[0].status
    decided = {(gate_suite.name, check.name): outcome}
    if status == "pass":
        return True, f"on: cases of a check share forwards ({gate} passed on {outcome[1]} cases)", decided
    return (
        False,
        f"off: {gate} did not pass ({status}), so rows of one batch may read each other; every case has forwards of its own",
        decided,
    )


def licence_extension(
    suite: Any, result: SuiteResult, context: RunContext, environment: dict[str, Any], attention: str | None = None
) -> None:
    """After a suite with an ``extension_gate``, where cases share forwards: whether the
    suites after it may stack unpadded rows of other lengths, each extended with later
    tokens (harness/engine/batching.py), set on ``context`` and said on the report's
    batching line. Only when every check of the gate passed, on every path it ran: a row's
    own logits are then the first positions of the longer row's, up to the noise of the
    longer forward, which the shape-changing rule allows wherever rows are stacked. Never
    for a prefix LM (``attention``): its prefix reads what follows it by design, and a longer
    row's default prefix is longer (harness/adapters/prefix.py)."""
    if not (context.batch_cases and suite.extension_gate):
        return
    gate = {name: f"{suite.name}/{name}" for name in suite.extension_gate}
    statuses = {check.name: check.status for check in result.checks}
    failed = [f"{gate[name]} {statuses.get(name, 'not run')}" for name in gate if statuses.get(name) != "pass"]
    context.extend_rows = not failed and attention != "prefix_lm"
    if attention == "prefix_lm":
        line = "unpadded rows stack at equal lengths only (a prefix LM's prefix reads what follows it)"
    elif failed:
        line = f"unpadded rows stack at equal lengths only ({', '.join(failed)}: a position may read what follows it)"
    else:
        line = f"unpadded rows of other lengths share forwards too, extended with later tokens ({' and '.join(gate.values())} passed)"
    environment["batching"] += f"; {line}"


CANONICAL_AVAILABLE = PathAvailability(CANONICAL)


def path_environment(adapter: Adapter, context: RunContext) -> list[dict[str, Any]]:
    """The call paths an audit runs, each with why it cannot where it cannot: the report's
    list (checks each say which of them they ran)."""
    backward = None
    if adapter.embedding_module() is None:
        backward = adapter.no_backward_reason or "the model has no nn.Embedding to differentiate"
    others = [a for a in adapter.paths() if context.paths is None or a.path.name in context.paths]
    if context.path_examples == 0:
        others = []  # a profile that gives the other paths no cases runs none
    return [
        CANONICAL_AVAILABLE.to_dict(),
        PathAvailability(TRAINING_BACKWARD, backward).to_dict(),
        *(available.to_dict() for available in others),
    ]


def release_unused_twin(adapter: Adapter, paths: list[dict[str, Any]]) -> None:
    """Drop the float32 copy made for the reference error when no path of this audit runs on it."""
    if not any(p["path"] == FLOAT32_TWIN.name and p["unavailable"] is None for p in paths):
        adapter.release_float32_twin()


def other_paths(names: Sequence[str] | None) -> tuple[str, ...] | None:
    """The call paths named besides the canonical one (None: all); an unknown name is a ValueError."""
    if names is None:
        return None
    unknown = sorted(set(names) - set(PATHS))
    if unknown:
        raise ValueError(f"unknown call path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    return tuple(name for name in names if name != CANONICAL.name)


def run_suite(suite: Any, adapter: Adapter, context: RunContext) -> SuiteResult:
    try:
        return _run_suite(suite, adapter, context)
    finally:
        adapter.release_state()  # the model as the suite found it, for the next suite and the host
        adapter.release_float64_twin()  # made for a failure judged again in float64, if any


def _run_suite(suite: Any, adapter: Adapter, context: RunContext) -> SuiteResult:
    started = time.perf_counter()
    result = SuiteResult(suite.name)
    reason = suite.not_applicable(adapter.capabilities)
    if reason:
        result.checks.append(CheckResult("applicable", "not_applicable", reason))
        return result
    try:
        checks = suite.checks(adapter, context)
    except Exception as exc:  # a suite that cannot even plan its checks is an error, not a crash
        result.checks.append(CheckResult("setup", "error", _describe(exc)))
        return result
    failures: list[FailedCheck] = []
    paths = PathChecks(suite, adapter, context)
    # by id(strategy): the suite's first check of it, and every case drawn (with their logs)
    # by the first check of it that passed; a failure stops before its draws are done
    first_of: dict[int, Check] = {}
    drawn_by: dict[int, list] = {}
    for check in checks:
        if isinstance(check, CheckResult):
            result.checks.append(check)
        elif context.deadline is not None and time.monotonic() > context.deadline:
            result.checks.append(
                CheckResult(check.name, "not_run", "the suite's time limit (--timeout) was reached before this check")
            )
        else:
            evaluated: list = []
            before = result.cases
            strategy = id(check.strategy)
            replaying = _replaying(check, first_of.get(strategy), drawn_by.get(strategy))
            checked = _run_one(
                replaying[0] if replaying else check,
                # its search, where it has no case to replay, keeps its draws to itself
                replace(context, drawn={}) if replaying else context,
                result,
                failures,
                suite.name,
                replayed=replaying[1] if replaying else None,
                evaluated=evaluated,
            )
            if not replaying:
                first_of.setdefault(strategy, check)
                if checked.status in ("pass", "warn"):
                    drawn_by.setdefault(strategy, evaluated)
            judged = paths.run(check, checked, result.cases - before, evaluated, result, failures)
            result.checks.append(_judged_again(suite, adapter, context, judged, failures))
    suite.conclude(result.checks)
    final = {check.name: check.message for check in result.checks}
    for failure in failures:  # a bundle records the audit's last word, which its replay reproduces
        message = final.get(failure.check, "")
        on_path = message.startswith(f"on the {failure.path} path (")
        if on_path or (failure.path == CANONICAL.name and not message.startswith("on the ")):
            failure.message = message
    if failures and context.bundle_dir is not None:
        result.reproduction = _bundle(suite, adapter, context, failures)
    if result.status in ("pass", "warn", "fail") and context.report_dir is not None and suite.draws_effective_mask:
        # A passing audit of a third-party checkpoint gets its pictures too: something to look at.
        result.picture = _draw(suite, adapter, context, failed=result.status == "fail")
    result.seconds = time.perf_counter() - started
    return result


def _judged_again(
    suite: Any, adapter: Adapter, context: RunContext, result: CheckResult, failures: list[FailedCheck]
) -> CheckResult:
    """A float32 failure near its threshold, judged again in float64 (rounding.py); one that
    turns out rounding leaves no failure to bundle."""
    failure = next((f for f in reversed(failures) if f.check == result.name), None)
    if failure is None or not near_the_bar(result):
        return result
    judged = judged_in_float64(suite, adapter, context, result, failure)
    if judged.status != "fail":
        failures[:] = [f for f in failures if f.check != result.name]
    return judged


def _replaying(check: Check, first: Check | None, drawn: list | None) -> tuple[Check, list | None] | None:
    """For a check that replays (``Check.replays``) after its suite's first check of the same
    strategy: the check to run, with that first check's count of examples, and the cases it
    evaluates, the most informative of those drawn once a check of the strategy passed. With
    that count, a replayed case that fails is found again among the same draws and shrunk;
    and where every check of the strategy failed (their draws were cut short), the cases are
    None: the check searches those same draws itself, stopping at its first failure. None
    for a check that draws its own (``max_examples``), with no check of its strategy before it."""
    if check.replays is None or first is None:
        return None
    cases = None if drawn is None else informative_cases([case for case, _ in drawn], check.replays)
    return replace(check, max_examples=first.max_examples), cases


def _bundle(suite: Any, adapter: Adapter, context: RunContext, failures: list[FailedCheck]) -> str | None:
    """Write the reproduction bundle of a failing suite; a bundle that cannot be written is
    reported as missing, never as a crash of the audit."""
    assert context.bundle_dir is not None
    try:
        return str(write_bundle(context.bundle_dir / f"repro-{suite.name}", suite, adapter, context, failures))
    except Exception as exc:  # pragma: no cover - disk full, unpicklable case ...
        print(f"maskcheck: could not write the reproduction bundle of {suite.name}: {_describe(exc)}", file=sys.stderr)
        return None


def _draw(suite: Any, adapter: Adapter, context: RunContext, failed: bool) -> str | None:
    """The effective-mask PNG of a mask suite; a drawing problem never fails the audit."""
    from ..report.picture import draw_effective_mask

    try:
        influence, expected = suite.effective_mask(adapter, context)
        assert context.report_dir is not None
        path = context.report_dir / f"{suite.name}-effective-mask.png"
        return str(draw_effective_mask(influence, expected, path, f"{adapter.spec}: {suite.name}", failed))
    except Exception:  # pragma: no cover - reported as a missing picture, not an error
        return None


class PathChecks:
    """A suite's checks on the call paths besides the canonical one (harness/adapters/paths.py).

    Each path's checks are planned once, by the suite itself, on the adapter that calls the
    model that way, and each check runs there on ``context.path_examples`` of the cases its
    canonical run evaluated, chosen by ``engine.suite.informative_cases`` (the longest case,
    then the richest, cheapest case of each other kind; a failure there is shrunk on the
    path). A check's result is its canonical one while every path passes; a path that fails
    (or warns, or errs, worse than the canonical result) gives the result, its message
    naming the path. Every path appears in the result's ``paths``, one that cannot run with
    its reason."""

    def __init__(self, suite: Any, adapter: Adapter, context: RunContext) -> None:
        self.suite, self.adapter = suite, adapter
        self.context = replace(context, examples=context.path_examples, decided={}, drawn={})
        self.canonical_examples = context.examples  # what a path's failure may draw to be shrunk
        calls, twin = bool(getattr(suite, "call_paths", False)), bool(getattr(suite, "float32_twin", False))
        chosen = (
            [a for a in adapter.paths() if context.paths is None or a.path.name in context.paths]
            if context.path_examples > 0
            else []
        )
        self.available = [a for a in chosen if (twin if a.path.twin else calls)]
        self.planned: dict[str, dict[str, Check] | CheckResult] = {}

    def context_on(self, path: Any) -> RunContext:
        """The run's context on ``path``: the float32 twin is judged at float32's thresholds."""
        if path.twin and self.context.twin_tolerance is not None:
            return replace(self.context, dtype="float32", tolerance=self.context.twin_tolerance)
        return self.context

    def checks_on(self, path: Any) -> dict[str, Check] | CheckResult:
        if path.name not in self.planned:
            try:
                planned = self.suite.checks(self.adapter.on_path(path), self.context_on(path))
                self.planned[path.name] = {c.name: c for c in planned if isinstance(c, Check)}
            except Exception as exc:  # a path on which the suite cannot plan: said on every check
                self.planned[path.name] = CheckResult("setup", "error", _describe(exc))
        return self.planned[path.name]

    def run(
        self,
        check: Check,
        canonical: CheckResult,
        cases: int,
        evaluated: list,
        result: SuiteResult,
        failures: list[FailedCheck],
    ) -> CheckResult:
        """``check``'s result over every path, given its ``canonical`` one (of ``cases`` cases,
        ``evaluated``, each with the log of its model calls). Each path replays the canonical
        cases that exercise the check most (``informative_cases``), except those whose every
        call the path leaves as the canonical path made it: their outcome there is the
        canonical one, and the path's entry counts them as ``same_calls``. With no case to
        replay (the canonical run evaluated none), a path draws its own."""
        # A check the call path cannot change (check.on_paths False) still runs on the float32 twin.
        usable = [a for a in self.available if check.on_paths or a.path.twin]
        own = CANONICAL.name if check.on_paths else check.path
        canonical.paths = [{"path": own, "status": canonical.status, "cases": cases}]
        if not usable:
            return canonical
        replayed = informative_cases(
            [case for case, _ in evaluated], self.context.examples, longest=self.suite.long_rows_on_paths
        )
        log_of = {id(case): log for case, log in evaluated}
        chosen = canonical
        for available in usable:
            path = available.path
            reason = available.reason
            if reason is None and canonical.status in ("fail", "error", "not_run"):
                # No path can make the check's result worse; the canonical failure is the one to fix first.
                reason = f"the canonical path already gave {canonical.status}"
            if reason is not None:
                canonical.paths.append({"path": path.name, "status": "not_run", "reason": reason})
                continue
            planned, same_calls = self.checks_on(path), 0
            if isinstance(planned, CheckResult):
                outcome, ran = CheckResult(check.name, "error", planned.message), 0
            elif check.name not in planned:
                canonical.paths.append(
                    {"path": path.name, "status": "not_run", "reason": "the suite plans no such check on this path"}
                )
                continue
            else:
                on_path = nearest_first(replayed, evaluated, canonical) if path.twin else replayed
                changed = [case for case in on_path if not log_of[id(case)].same_on(path)]
                same_calls = len(on_path) - len(changed)
                if replayed and not changed:
                    # every replayed case would call the model as it did: its outcome stands
                    entry = {"path": path.name, "status": canonical.status, "cases": 0, "same_calls": same_calls}
                    canonical.paths.append(entry)
                    continue
                before = result.cases
                outcome = _run_one(
                    planned[check.name],
                    self.context_on(path),
                    result,
                    failures,
                    self.suite.name,
                    path.name,
                    changed,
                    shrink_examples=self.canonical_examples,
                )
                ran = result.cases - before
            entry = {"path": path.name, "status": outcome.status, "cases": ran}
            if same_calls:
                entry["same_calls"] = same_calls
            canonical.paths.append(entry)
            if SEVERITY[outcome.status] > SEVERITY[chosen.status]:
                outcome.message = f"on the {path.name} path ({path.description}): {outcome.message}"
                chosen = outcome
        if chosen is not canonical:
            chosen.paths = canonical.paths
        return chosen


def nearest_first(replayed: list, evaluated: list, canonical: CheckResult) -> list:
    """``replayed`` with the canonical case nearest its threshold first (the case a pass
    reports, its worst by measured ratio), for the float32 twin: a leak smaller than low
    precision's rounding is largest where the low-precision run came closest to failing,
    and the richest short cases need not be that case (a chunk a packed sequence straddles)."""
    worst = next((case for case, _ in evaluated if case_to_dict(case) == canonical.case), None)
    if worst is None or any(case is worst for case in replayed):
        return replayed
    return [worst, *replayed]


def _run_one(
    check: Check,
    context: RunContext,
    result: SuiteResult,
    failures: list[FailedCheck],
    suite: str = "",
    path: str = CANONICAL.name,
    replayed: list | None = None,
    evaluated: list | None = None,
    shrink_examples: int | None = None,
) -> CheckResult:
    """Run ``check`` (on ``replayed`` cases first, when given) and add its cases and failure
    to ``result`` and ``failures``; ``evaluated`` receives the distinct cases it evaluated,
    each with the log of its model calls.
    ``shrink_examples``: the cases a search may draw to shrink a replayed case's failure."""
    try:
        decided = context.decided.get((suite, check.name))
        if decided is not None:
            check_result, cases, failure, seen = decided
            if evaluated is not None:
                evaluated.extend(seen)
        elif replayed:
            check_result, cases, failure = replay_first(check, context, replayed, shrink_examples, seen=evaluated)
        else:
            check_result, cases, failure, seen = run_check_keeping_cases(check, context)
            if evaluated is not None:
                evaluated.extend(seen)
    except Exception as exc:
        return CheckResult(check.name, "error", _describe(exc))
    result.cases += cases
    if failure is not None:
        failures.append(FailedCheck(check.name, failure.case, failure.outcome, path))
    return check_result


def _describe(exc: BaseException) -> str:
    if isinstance(exc, AdapterError):
        return str(exc)
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return OUT_OF_MEMORY
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {Path(frame.filename).name}:{frame.lineno}" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


__all__ = ["AuditResult", "UnknownSuiteError", "audit", "SCHEMA_VERSION"]
