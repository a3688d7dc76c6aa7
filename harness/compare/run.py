"""``maskcheck compare``: two implementations of one model, check by check.

Each suite's checks are built on a :class:`PairedAdapter` of A and B and run as an audit
runs them (the same seeds, the same Hypothesis draws and shrinking), except that a case's
verdict is compare's: did B part from A in any call the case made? A failing check is
shrunk to its smallest case, whose first parting call is made again with hooks on both
models to name the first module at which they part (``layers.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..adapters.memo import forward_memo
from ..adapters.specs import adapter_for, load_adapter
from ..engine.batching import run_alone
from ..engine.profiles import check_profile, examples_of, path_examples_of
from ..engine.registry import load_suite
from ..engine.suite import (
    Check,
    CheckResult,
    RunContext,
    case_to_dict,
    informative_cases,
    replay_first,
    run_check_keeping_cases,
)
from ..engine.tolerance import measure_reference_error, tolerance_for
from ..report.reproduction import BundleError
from .gradients import module_output_gradients
from .layers import FirstDifference, Record, first_difference, module_outputs, relative_tolerance
from .paired import PairedAdapter, Parting, Recorder, replay
from .reproduction import TEST_FILE, bundle_name, write_parting
from .weights import KeyMapping, load_weights

#: the suites compare runs by default: those whose checks compare model outputs on inputs
#: the suites build (norm_checkpoint compares layouts of one checkpoint, collator no model)
DEFAULT_SUITES = ("causal", "padding", "cross_attention", "loss_masking", "packing", "kv_cache", "serving")
#: capabilities that, where A and B differ, mean the suites ask each of them other things
CONVENTIONS = ("family", "vocab_size", "takes_attention_mask", "has_cache", "position_offset", "window", "max_length")


class CompareError(ValueError):
    """The two models cannot be compared (their vocabularies or families differ)."""


def worst_status(statuses: Any) -> str:
    """error, then fail, then pass, then not_run: a pass needs one check that compared and agreed."""
    found = set(statuses)
    return next((s for s in ("error", "fail", "pass", "not_run") if s in found), "not_applicable")


@dataclass
class CheckComparison:
    name: str
    status: str  # pass, fail, not_applicable, error, not_run
    message: str
    case: dict[str, Any] | None = None
    first_difference: FirstDifference | None = None
    cases: int = 0
    reproduction: str | None = None  # the folder of the test that fails on its own (reproduction.py)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "first_difference"}
        out["first_difference"] = None if self.first_difference is None else dataclasses.asdict(self.first_difference)
        return out


@dataclass
class SuiteComparison:
    name: str
    checks: list[CheckComparison] = field(default_factory=list)

    @property
    def status(self) -> str:
        return worst_status(c.status for c in self.checks)


@dataclass
class CompareResult:
    a: str
    b: str
    suites: list[SuiteComparison]
    conventions: list[str]  # the capabilities in which A and B differ, said as such
    weights: dict[str, Any] | None
    seconds: float

    @property
    def status(self) -> str:
        return worst_status(s.status for s in self.suites)

    def __str__(self) -> str:  # what a failing ``assert result.status == "pass", result`` prints
        from .render import render_comparison

        return render_comparison(self)

    @property
    def exit_code(self) -> int:
        """0 when every check compared agrees, 1 when one parts or errs, 2 when none compared anything."""
        return {"pass": 0, "fail": 1, "error": 1}.get(self.status, 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "status": self.status,
            "conventions": self.conventions,
            "weights": self.weights,
            "seconds": round(self.seconds, 2),
            "suites": [
                {"name": s.name, "status": s.status, "checks": [c.to_dict() for c in s.checks]} for s in self.suites
            ],
        }


def compare(
    a: Any,
    b: Any,
    suites: Sequence[str] | None = None,
    *,
    profile: str = "ci",
    seed: int = 0,
    examples: int | None = None,
    module_map: Mapping[str, str] | None = None,
    weights: bool | KeyMapping = False,
    options: Any = None,
    progress: Callable[[str], None] | None = None,
    bundle_dir: str | Path | None = None,
) -> CompareResult:
    """Compare A and B (spec strings, models or adapters) on ``suites``' cases (default:
    :data:`DEFAULT_SUITES`). ``weights``: load A's weights into B first, under this key
    mapping (True: the same names). ``module_map``: A's module names to B's, for
    implementations whose module trees differ (by order and shape otherwise).
    ``bundle_dir``: where each parting check's reproduction is written
    (``repro-compare-<suite>-<check>/``, reproduction.py)."""
    started = time.perf_counter()
    first = load_adapter(a, options) if isinstance(a, str) else adapter_for(a)
    second = load_adapter(b, options) if isinstance(b, str) else adapter_for(b)
    loaded = None
    if weights is not False:
        loaded = load_weights(first.model, second.model, None if weights is True else weights)
    conventions = differing_conventions(first, second)
    check_profile(profile)
    caps = first.capabilities
    tolerance = tolerance_for(caps.device, caps.dtype)
    errors = [e for e in (measure_reference_error(first), measure_reference_error(second)) if e is not None]
    if errors:
        tolerance = replace(tolerance, reference_error=max(errors))
    context = RunContext(
        tolerance=tolerance,
        dtype=caps.dtype,
        units=caps.output_kind.units,
        seed=seed,
        examples=examples if examples is not None else examples_of(profile),
        profile=profile,
        paths=None,  # every path A and B share (shared_paths)
        path_examples=path_examples_of(profile, examples if examples is not None else examples_of(profile)),
        batch_cases=False,
    )
    recorder = Recorder(tolerance, caps.dtype)
    paired = PairedAdapter(first, second, recorder)

    def reproduce(suite: str, check: str, parting: Parting, located: FirstDifference | None) -> str:
        """Write the check's reproduction; its folder (BundleError: why it cannot be written)."""
        folder = Path(bundle_dir) / bundle_name(suite, check)  # type: ignore[arg-type]
        return str(write_parting(folder, suite, check, parting, first, second, tolerance, caps.dtype, weights, located))

    names = list(suites) if suites else list(DEFAULT_SUITES)
    loaded_suites = [(name, load_suite(name)) for name in names]
    results = []
    for name, suite in loaded_suites:
        if progress is not None:
            progress(name)
        try:
            results.append(
                compare_suite(name, suite, paired, context, module_map, reproduce if bundle_dir is not None else None)
            )
        finally:
            paired.release_state()
    return CompareResult(first.spec, second.spec, results, conventions, loaded, time.perf_counter() - started)


def differing_conventions(a: Any, b: Any) -> list[str]:
    """The capabilities in which A and B differ; a family or vocabulary that differs makes
    them two models, not two implementations of one (:class:`CompareError`)."""
    said = []
    for name in CONVENTIONS:
        x, y = getattr(a.capabilities, name, None), getattr(b.capabilities, name, None)
        if x != y:
            if name in ("family", "vocab_size"):
                raise CompareError(f"A and B are not one model: A's {name} is {x!r}, B's {y!r}")
            said.append(f"{name}: A {x!r}, B {y!r}")
    return said


#: writes a parting check's reproduction: (suite, check, parting, first difference) -> its folder
Reproduce = Callable[[str, str, Parting, "FirstDifference | None"], str]


def compare_suite(
    name: str, suite: Any, paired: PairedAdapter, context: RunContext, module_map: Any, reproduce: Reproduce | None
) -> SuiteComparison:
    result = SuiteComparison(name)
    reason = suite.not_applicable(paired.capabilities)
    if reason:
        result.checks.append(CheckComparison("applicable", "not_applicable", reason))
        return result
    try:
        checks = suite.checks(paired, context)
    except Exception as exc:  # noqa: BLE001 - one suite that cannot plan its checks stops no other
        result.checks.append(CheckComparison("setup", "error", f"{type(exc).__name__}: {exc}"))
        return result
    write = reproduce and partial(reproduce, name)
    on_paths = shared_paths(suite, paired, context)
    for check in checks:
        if isinstance(check, CheckResult):
            result.checks.append(CheckComparison(check.name, check.status, check.message))
            continue
        evaluated: list = []
        compared_check = compare_check(check, paired, context, module_map, write, seen=evaluated)
        if compared_check.status == "pass" and check.on_paths and evaluated:
            replayed = informative_cases(
                [case for case, _ in evaluated], context.path_examples, longest=suite.long_rows_on_paths
            )
            compared_check = on_other_paths(compared_check, check.name, on_paths, module_map, write, replayed)
        result.checks.append(compared_check)
    return result


def shared_paths(suite: Any, paired: PairedAdapter, context: RunContext) -> list[tuple[str, Any]]:
    """``(path, the suite's checks by name there)`` for each call path besides the canonical one
    that A and B can both take (the float32 twin is an audit's, not a comparison's); a path the
    suite cannot plan on is left out with the rest of A's own."""
    if not getattr(suite, "call_paths", False) or context.path_examples <= 0:
        return []
    theirs = {p.path.name: p.reason for p in paired.b.paths()}
    planned = []
    for available in paired.a.paths():
        path = available.path
        if path.twin or available.reason is not None or theirs.get(path.name, "absent") is not None:
            continue
        on_path = replace(context, examples=context.path_examples, decided={}, drawn={})
        pair = paired.on_path(path)
        try:
            checks = {c.name: c for c in suite.checks(pair, on_path) if isinstance(c, Check)}
        except Exception:  # noqa: BLE001 - what the suite cannot plan on a path, its audit says
            continue
        planned.append((path.name, (pair, on_path, checks, context.examples)))
    return planned


def on_other_paths(
    canonical: CheckComparison,
    name: str,
    on_paths: list[tuple[str, Any]],
    module_map: Any,
    write: Any,
    replayed: list,
) -> CheckComparison:
    """A check that agrees on the canonical path, compared again on each shared path on the
    canonical cases that exercise it most (``replayed``, as an audit's paths replay them): the
    first path where B parts from A (or errs) gives the result, its message naming the path."""
    compared_on = []
    for path, (pair, context, checks, shrink_examples) in on_paths:
        if name not in checks:
            continue
        found = compare_check(checks[name], pair, context, module_map, write, replay=(replayed, shrink_examples))
        if found.status in ("fail", "error"):
            return replace(found, message=f"on the {path} path: {found.message}", cases=canonical.cases)
        if found.status == "pass":
            compared_on.append(path)
    if compared_on:
        canonical.message += f"; agrees on the {', '.join(compared_on)} path(s) too"
    return canonical


def compared(check: Check, paired: PairedAdapter) -> Check:
    """``check`` whose verdict on a case is whether B parted from A during it."""
    recorder = paired.recorder

    def evaluate(case: Any) -> Any:
        recorder.start()
        try:
            run_alone(check.evaluate(case))
        except Exception:
            if recorder.b_errors:
                return recorder.outcome()
            raise
        return recorder.outcome()

    return replace(check, evaluate=evaluate, batchable=False, replays=None)


def compare_check(
    check: Check,
    paired: PairedAdapter,
    context: RunContext,
    module_map: Any,
    reproduce: Callable[[str, Parting, FirstDifference | None], str] | None = None,  # Reproduce, its suite given
    seen: list | None = None,
    replay: tuple[list, int] | None = None,
) -> CheckComparison:
    """``check`` compared on its drawn cases (``seen`` receives them, each with its call log),
    or with ``replay`` = (cases, examples) on those cases, a failure shrunk with that many draws."""
    recorder = paired.recorder
    recorder.start_check()
    try:
        if replay is None:
            checked, cases, failure, evaluated = run_check_keeping_cases(compared(check, paired), context)
            if seen is not None:
                seen.extend(evaluated)
        else:
            checked, cases, failure = replay_first(compared(check, paired), context, replay[0], replay[1])
    except Exception as exc:  # noqa: BLE001 - one check's error stops no other
        return CheckComparison(check.name, "error", f"{type(exc).__name__}: {exc}")
    if failure is None and checked.status == "pass":
        if not recorder.check_calls:
            return CheckComparison(
                check.name,
                "not_run",
                "its cases make no call compare judges (its loss values or hooks are A's alone)",
                cases=cases,
            )
        return CheckComparison(
            check.name,
            "pass",
            f"{cases} case(s), {recorder.check_calls} call(s) compared; the closest at "
            f"{recorder.check_worst:.2f} of its threshold",
            cases=cases,
        )
    if failure is None:
        return CheckComparison(check.name, checked.status, checked.message, cases=cases)
    parting = failure.outcome.detail.get("parting")  # None where B raised: there is no call to replay
    located = None if parting is None else locate(parting, paired, context, module_map)
    message = checked.message
    if located is not None:
        message += f"; {located.describe()}"
    elif parting is not None and not hookable(paired):
        message += "; no module is named: the exported graph records no module its outputs came from, or none differs"
    elif parting is not None:
        message += "; no matched module differs: the two part in what is computed outside the models' modules"
    written = None
    if reproduce is not None and parting is not None:
        try:
            written = reproduce(check.name, parting, located)
            message += f"; reproduction: pytest {Path(written) / TEST_FILE}"
        except (BundleError, OSError) as exc:
            message += f"; no reproduction written: {exc}"
    return CheckComparison(check.name, "fail", message, case_to_dict(failure.case), located, cases, written)


def named_as(graph: list[Record], model: list[Record]) -> list[Record]:
    """An exported graph's module records under the model's names: an export wrapper puts
    its own attribute before them (``model.transformer.h.0`` for ``transformer.h.0``), so the
    leading components whose removal names the most of the model's modules are removed."""
    names = {record.name for record in model}

    def stripped(name: str, depth: int) -> str:
        return name.split(".", depth)[-1] if name.count(".") >= depth else name

    depth = max(range(4), key=lambda d: sum(stripped(record.name, d) in names for record in graph))
    return [dataclasses.replace(record, name=stripped(record.name, depth)) for record in graph]


def hookable(paired: PairedAdapter) -> bool:
    """Whether both models are modules whose outputs hooks can record (an exported graph is not)."""
    return all(isinstance(side.model, torch.nn.Module) for side in (paired.a, paired.b))


def locate(parting: Parting, paired: PairedAdapter, context: RunContext, module_map: Any) -> FirstDifference | None:
    """The first module at which A and B part in ``parting``'s call, made again on both with
    hooks: the first whose output differs, or for a backward that parts, the first whose
    output's gradient differs, going backward (``gradients.py``); None where no matched
    module differs (a loss's backward to the logits: the loss is no module)."""
    recorded = module_output_gradients if parting.kind == "gradients" else module_outputs
    graphs = [not isinstance(side.model, torch.nn.Module) for side in (paired.a, paired.b)]
    if any(graphs) and parting.kind == "gradients":
        return None  # an exported graph has no backward
    records = []
    with forward_memo(False):  # the hooks must see the call made, not a remembered result
        for adapter, graph in zip((paired.a, paired.b), graphs):
            run = partial(replay, adapter, parting.history)  # run(arm): arm() before the last call
            if not graph:
                records.append(recorded(adapter.model, run))
            elif hasattr(adapter, "module_outputs"):  # an exported graph: what its exporter recorded per module
                records.append([Record(name, output) for name, output in adapter.module_outputs(run)])
            else:
                return None
    if not all(records):
        return None
    if any(graphs) and not all(graphs):  # a graph's modules under the model's names, matched by name
        graph, model = (0, 1) if graphs[0] else (1, 0)
        records[graph] = named_as(records[graph], records[model])
        if module_map is None:
            module_map = {record.name: record.name for record in records[graph]}
    rows = int(parting.where.shape[0])
    found = first_difference(*records, relative_tolerance(context.tolerance, context.dtype), rows, module_map)
    if found is not None and any(graphs) and found.matching == "mapping":
        found = replace(found, matching="name, the graph's from its exporter's module scopes")
    return None if found is None else replace(found, backward=parting.kind == "gradients")
