"""maskcheck inside pytest: model entries, the per-session adapter cache, and the test helper.

Imports torch only when a test runs. A test author generates the suite tests for their
own model in one line::

    from maskcheck import maskcheck_tests

    test_my_model = maskcheck_tests(build_my_model, suites=["causal", "padding", "kv_cache"])

which yields one test per suite (``test_my_model[causal]`` ...), each building the model
once per session, skipping the suites that do not apply, warning on ``warn`` and failing
with the verdict and the reproduction bundle's path.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest


class MaskcheckWarning(UserWarning):
    """A check that warned: a real behaviour to know that is not a leak."""


class MaskcheckFailure(Exception):
    """A suite that failed, errored or did not run; the message is its verdict."""


@dataclass(frozen=True)
class ModelEntry:
    """A model the plugin audits: ``name`` goes into test ids, ``load`` is a spec or a factory."""

    name: str
    load: str | Callable[[], Any] = field(compare=False)

    @classmethod
    def of(cls, value: "ModelEntry | str") -> "ModelEntry":
        if isinstance(value, ModelEntry):
            return value
        if isinstance(value, str):
            return cls(value, value)
        raise TypeError(f"a maskcheck model is a spec string or a ModelEntry, got {type(value).__name__}")

    @property
    def slug(self) -> str:
        """A file-system-safe name for this model's report directory."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name).strip("_") or "model"


@dataclass
class RunOptions:
    profile: str = "ci"
    device: str = "cpu"
    dtype: str | None = None
    examples: int | None = None
    seed: int = 0
    report_dir: Path | None = None
    timeout: float | None = None
    known_findings: Sequence[Any] = ()
    disabled_conventions: Sequence[str] = ()
    tolerance: dict[str, Any] | None = None
    threads: str | int = "auto"  # torch threads in this process (maskcheck.harness.plugin.threads)
    paths: Sequence[str] | None = None  # call paths besides the canonical one (None: every path)


#: this pytest run's id, set by the plugin (workers get the controller's): results of other runs are never merged
RUN_ID = "no-run"


class AdapterCache:
    """One adapter per model per session: building a model is the expensive part."""

    def __init__(self) -> None:
        self._adapters: dict[ModelEntry, Any] = {}
        self._errors: dict[ModelEntry, str] = {}

    def get(self, entry: ModelEntry, options: RunOptions) -> Any:
        if entry in self._errors:
            raise MaskcheckFailure(self._errors[entry])
        if entry not in self._adapters:
            from .host_state import as_guest

            try:
                with as_guest():  # building a model seeds torch; the host's random state stays its own
                    self._adapters[entry] = load(entry, options)
            except Exception as exc:
                self._errors[entry] = f"cannot load {entry.name}: {exc}"
                raise MaskcheckFailure(self._errors[entry]) from None
        return self._adapters[entry]


def load(entry: ModelEntry, options: RunOptions) -> Any:
    from ..adapters.specs import LoadOptions, adapter_for, factory_spec, load_adapter

    if isinstance(entry.load, str):
        return load_adapter(entry.load, LoadOptions(device=options.device, dtype=options.dtype))
    model = entry.load()
    adapter = adapter_for(model, entry.name)
    adapter.spec = entry.name if adapter.spec.startswith("<") else adapter.spec
    adapter.replay_spec = factory_spec(entry.load)  # how a reproduction bundle rebuilds it (None: a closure)
    return adapter


def run_suite_test(
    adapter: Any, suite: str, options: RunOptions, item: Any = None, slug: str = "model", with_padding: bool = True
) -> Any:
    """Audit one suite; skip, warn or fail the calling test as its verdict says. Returns the AuditResult.

    ``with_padding``: the padding suite is among this model's tests, so its batch_composition
    check (which decides whether cases share forwards) runs before the first suite this
    process audits, once per model, and the padding test reports that same run."""
    from .host_state import as_guest
    from .threads import audit_threads, parse_threads

    with as_guest(audit_threads(parse_threads(options.threads))):
        result = _audit_one(adapter, suite, options, slug, with_padding)
    return _report_verdict(result, adapter, suite, item)


def _audit_one(adapter: Any, suite: str, options: RunOptions, slug: str, with_padding: bool) -> Any:
    from ..audits.runner import audit
    from .run_report import write_result

    report_dir = options.report_dir / slug if options.report_dir is not None else None
    result = audit(
        adapter,
        [suite],
        profile=options.profile,
        examples=options.examples,
        seed=options.seed,
        timeout=options.timeout,
        known_findings=options.known_findings,
        disabled_conventions=options.disabled_conventions,
        tolerance_overrides=options.tolerance,
        report_dir=report_dir,
        bundle_dir=report_dir or Path("maskcheck-report") / slug,
        batch_cases=True if with_padding else None,
        paths=options.paths,
    )
    if report_dir is not None:
        # One file per test: pytest-xdist workers never write the same file; the controller merges them.
        write_result(report_dir, suite, result.to_dict(), RUN_ID)
    return result


def _report_verdict(result: Any, adapter: Any, suite: str, item: Any) -> Any:
    """Skip, warn or fail the calling test as the audit's verdict says."""
    from ..engine.verdict import FAILING

    suite_result = result.suites[0]
    if item is not None:
        for check in suite_result.checks:
            for key in ("max_diff", "floor", "threshold"):
                value = getattr(check, key)
                if value is not None:
                    item.user_properties.append((f"{check.name}.{key}", value))
            item.user_properties.append((f"{check.name}.status", check.status))
    if suite_result.status == "not_applicable":
        pytest.skip(suite_result.checks[0].message if suite_result.checks else "not applicable")
    if suite_result.status in FAILING:
        raise MaskcheckFailure(verdict_text(result))
    for check in suite_result.checks:
        # A pass must not stand silently on checks that did not run: each is a warning with its reason.
        if check.status in ("warn", "not_applicable"):
            said = check.message if check.status == "warn" else f"not run (n/a): {check.message}"
            filename, lineno = warning_location(item, adapter.spec)
            warnings.warn_explicit(
                MaskcheckWarning(f"maskcheck {suite}/{check.name} on {adapter.spec}: {said}"),
                MaskcheckWarning,
                filename,
                lineno,
            )
    return result


def warning_location(item: Any, spec: str) -> tuple[str, int]:
    """Where a warning about ``spec`` points: the line of the host's configuration that names
    it (pyproject.toml or the ini file), else the test's own file; never maskcheck's code."""
    config = getattr(item, "config", None)
    inipath = getattr(config, "inipath", None)
    if inipath is not None:
        try:
            for number, line in enumerate(Path(inipath).read_text().splitlines(), start=1):
                if spec in line:
                    return str(inipath), number
        except OSError:
            pass
    path = getattr(item, "path", None)
    if path is not None and Path(path).is_file():
        return str(path), 1
    return str(inipath or "maskcheck"), 1


def run_collator_test(factory: str, task: str, options: RunOptions) -> Any:
    """The collator checks of ``task`` on ``factory``; fail the calling test as their verdict says."""
    from ..audits.collator_audit import CollatorError, audit_collator
    from ..engine.verdict import FAILING

    slug = ModelEntry(f"collator-{factory}", factory).slug  # the report directory, named as a model's is
    try:
        result = audit_collator(
            f"collator:{factory}",
            task,
            seed=options.seed,
            profile=options.profile,
            examples=options.examples,
            bundle_dir=(options.report_dir or Path("maskcheck-report")) / slug,
        )
    except CollatorError as exc:
        raise MaskcheckFailure(f"cannot load collator:{factory}: {exc}") from None
    if result.suites[0].status in FAILING:
        raise MaskcheckFailure(verdict_text(result))
    return result


def compare_slug(pair: Any) -> str:
    """The report directory of a configured pair, named as a model's is."""
    return ModelEntry(f"compare-{pair.name}", pair.a).slug


def run_compare_test(pair: Any, options: RunOptions) -> Any:
    """``maskcheck compare`` of one configured pair (:class:`~maskcheck.harness.audits.config.ComparePair`);
    fail the calling test where B parts from A, errs, or nothing was compared. Both models are
    built for this test alone: B is given A's weights, which must not reach another test's model."""
    from ..compare.run import CompareError, compare
    from ..compare.weights import WeightsMismatch, name_map
    from ..engine.registry import UnknownSuiteError
    from .host_state import as_guest

    folder = (options.report_dir or Path("maskcheck-report")) / compare_slug(pair)
    try:
        weights: Any = True if pair.weights == "same" else name_map(pair.weights, "weights") or False
        module_map = name_map(pair.module_map, "map")
        with as_guest():
            a, b = (load(ModelEntry.of(spec), options) for spec in (pair.a, pair.b))
            result = compare(
                a,
                b,
                list(pair.suites) or None,
                profile=options.profile,
                seed=options.seed,
                examples=options.examples,
                module_map=module_map,
                weights=weights,
                bundle_dir=folder,
            )
    except (CompareError, WeightsMismatch, UnknownSuiteError, ValueError, OSError) as exc:
        raise MaskcheckFailure(f"maskcheck compare {pair.a} {pair.b}: {exc}") from None
    except Exception as exc:  # a model that cannot be built or called: the pair's failure, in one line
        raise MaskcheckFailure(f"maskcheck compare {pair.a} {pair.b}: {type(exc).__name__}: {exc}") from None
    from ..report.render import write_json

    write_json(folder / "compare.json", result.to_dict())
    if result.exit_code == 2:
        raise MaskcheckFailure(f"maskcheck compare {pair.a} {pair.b} compared nothing:\n{result}")
    if result.exit_code:
        raise MaskcheckFailure(str(result))
    return result


def verdict_text(result: Any) -> str:
    from ..report.render import STATUS_MARK, case_lines, how_to_reproduce

    suite = result.suites[0]
    lines = [f"maskcheck {suite.name} on {result.model}: {STATUS_MARK[suite.status]}"]
    for check in suite.checks:
        if check.status not in ("pass", "not_applicable"):
            lines.append(f"  {check.name}: {STATUS_MARK[check.status]}: {check.message}")
            lines += case_lines(check)
    if suite.reproduction:
        lines.append(f"  reproduction: {how_to_reproduce(suite.reproduction)}")
        note = bundle_model_note(suite.reproduction)
        if note:
            lines.append(f"  {note}")
    return "\n".join(lines)


def bundle_model_note(bundle: str) -> str | None:
    """The bundle's one line on a model it cannot rebuild by itself, if any."""
    from ..report.reproduction import BundleError, load_bundle

    try:
        return load_bundle(bundle)["model"].get("note")
    except (BundleError, KeyError, AttributeError):
        return None


_SESSION_CACHE = AdapterCache()


def maskcheck_tests(
    model: str | Callable[[], Any],
    suites: Sequence[str] | None = None,
    *,
    name: str | None = None,
    **options: Any,
) -> Callable[..., None]:
    """A test function parametrized over ``suites`` (default: every registered suite) for one model.

    ``model`` is a spec or a factory (called once per session, when the first test runs).
    ``options`` are :class:`RunOptions` fields (profile, device, dtype, examples, seed, report_dir, timeout).
    """
    from ..engine.registry import suite_names

    entry = ModelEntry(name or (model if isinstance(model, str) else getattr(model, "__qualname__", "model")), model)
    run = RunOptions(**options)
    chosen = list(suites) if suites else suite_names()

    @pytest.mark.maskcheck
    @pytest.mark.parametrize("maskcheck_suite", chosen)
    def test(maskcheck_suite: str, request: pytest.FixtureRequest) -> None:
        __tracebackhide__ = True
        try:
            adapter = _SESSION_CACHE.get(entry, run)
            run_suite_test(adapter, maskcheck_suite, run, request.node, entry.slug, "padding" in chosen)
            return
        except MaskcheckFailure as failure:
            message = str(failure)
        pytest.fail(message, pytrace=False)  # outside the except block: one message, no chained traceback

    return test
