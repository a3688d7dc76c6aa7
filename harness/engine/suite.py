"""What a suite is, and how one of its checks runs under Hypothesis.

A suite is a set of named checks of one invariance property. A check has a
Hypothesis strategy that draws a *case* (structure plus an integer seed for token
ids, so shrinking minimises batch size, lengths and positions) and a function that
evaluates one case to an :class:`Outcome`. A failing case is shrunk by Hypothesis
and reported with its outcome.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ..adapters.base import Adapter, AdapterError, Capabilities
from ..adapters.paths import CallLog, logging_calls
from .batching import extending, run_alone, run_together, stacking
from .profiles import profile_settings, without_local_constants
from .strategies import MARK, reaching
from .tolerance import Tolerance
from .verdict import SEVERITY, CheckResult


@dataclass
class RunContext:
    tolerance: Tolerance
    dtype: str = "float32"
    # How outputs are compared: as log-probabilities (a distribution's logits) or as the raw
    # values (rewards, embeddings, regression); the adapter's output kind says which
    # (harness/adapters/outputs.py), and the runner copies it here.
    units: str = "log_probabilities"
    seed: int = 0
    examples: int = 20
    report_dir: Path | None = None  # pictures of failing mask suites
    bundle_dir: Path | None = None  # reproduction bundles of failing suites
    shrink: bool = True
    profile: str = "dev"
    deadline: float | None = None  # time.monotonic() after which no new case starts
    # Seconds a check may spend shrinking once it has found a failure; then it reports the
    # smallest failing case found so far (Hypothesis's own bound is 500 shrinks or 300 s).
    shrink_seconds: float | None = 60.0
    on_case: Callable[[str, int, int], None] | None = None  # (check, cases done, cases planned), for a progress display
    # Cases of one example share forwards (harness/engine/batching.py); the runner sets it once the
    # model's rows were shown not to read each other.
    batch_cases: bool = False
    # Unpadded rows of other lengths share forwards too, each extended with later tokens
    # (harness/engine/batching.py); the runner sets it once the model's positions were
    # shown to read nothing after them (``Suite.extension_gate``).
    extend_rows: bool = False
    # (suite, check) -> run_check_keeping_cases's answer, for a check run before its suite (the batching gate)
    decided: dict[tuple[str, str], tuple] = field(default_factory=dict)
    # The call paths checks also run on besides the canonical one (harness/adapters/paths.py),
    # by name; None: every path the model can take. Each runs ``path_examples`` cases a check.
    paths: tuple[str, ...] | None = None
    path_examples: int = 3
    # The float32 thresholds the float32_twin path judges a low-precision model's copy by.
    twin_tolerance: Tolerance | None = None
    # Hypothesis's examples per strategy object, kept from a check that passed, for the
    # next check given the same strategy (see Check).
    drawn: dict[tuple[int, int, int], "DrawnCases"] = field(default_factory=dict)

    @property
    def log_probabilities(self) -> bool:
        """Whether outputs are compared as log-probabilities (else raw: :attr:`units`)."""
        return self.units == "log_probabilities"


@dataclass
class Outcome:
    """The verdict on one case."""

    status: str  # pass, fail or warn
    max_diff: float = 0.0
    floor: float = 0.0
    threshold: float = 0.0
    positions: list[list[int]] = field(default_factory=list)
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)  # extra data for pictures and reproduction
    positions_label: str = "row, position"  # what each pair in ``positions`` counts
    # rows a report shows as a table (the variants a layout was scored under)
    table: list[dict[str, Any]] = field(default_factory=list)
    # The name of the explanation the message ends with (harness/engine/cases.py:
    # CAVEATS), for a check that later revises it; None when the message has none.
    caveat: str | None = None

    def result(self, check: str, status: str, message: str, case: dict[str, Any], **extra: Any) -> CheckResult:
        """The check's result that this case's outcome decides."""
        return CheckResult(
            check,
            status,
            message,
            max_diff=self.max_diff,
            floor=self.floor,
            threshold=self.threshold,
            positions=self.positions,
            case=case,
            positions_label=self.positions_label,
            table=self.table,
            caveat=self.caveat,
            **extra,
        )

    @property
    def ratio(self) -> float:
        if self.threshold <= 0:
            return float("inf") if self.max_diff > 0 else 0.0
        return self.max_diff / self.threshold


@dataclass
class Check:
    """One property over drawn cases.

    Checks given the same strategy *object* (not an equal one) see the same cases, and
    Hypothesis draws them once: the first check runs Hypothesis; when it passes, the next
    replays its examples in plain Python. A replayed case that fails sends that check back
    to Hypothesis, which draws the same examples again (same seed, answered from the
    check's memo) and shrinks the failure. On a tiny model a drawn case costs about as
    much as its forwards, so drawing once matters.
    """

    name: str
    evaluate: Callable[[Any], Any]  # an Outcome, or an evaluation that asks for logits (harness.engine.batching)
    strategy: st.SearchStrategy[Any]
    # The most examples worth drawing; a check with a small case space says so.
    max_examples: int | None = None
    # False for a check whose cases must each have their forwards to themselves (the one
    # that measures whether rows of a batch read each other).
    batchable: bool = True
    # False for a check the call path cannot change (it reads attention weights through
    # hooks, makes no model call, or fixes its own path): it runs once, on ``path``.
    on_paths: bool = True
    path: str = "canonical"  # the path it runs on when ``on_paths`` is False (harness/adapters/paths.py)
    # For a costly check (a backward): evaluate this many of the cases drawn by the suite's
    # checks of the same strategy before it, the most informative first (:func:`informative_cases`),
    # instead of drawing its own (harness/audits/runner.py: ``_replaying``); it draws
    # ``max_examples`` of its own only where no check of its strategy ran before it.
    replays: int | None = None

    def outcome(self, case: Any) -> Outcome:
        """The outcome of one case, each forward it asks for run on its own."""
        return run_alone(self.evaluate(case))


@dataclass
class DrawnCases:
    strategy: st.SearchStrategy[Any]  # kept alive, so its id() is not reused while it is a key
    examples: list[list[Any]]


#: the most random cases drawn in one Hypothesis example: Hypothesis's fixed cost per
#: example is shared by up to this many cases
CASES_PER_EXAMPLE = 10


class ProbeError(Exception):
    """A probe that cannot run on a model (no tokenizer, no synthetic vocabulary ...); one line for the user."""


class TimeLimitReached(Exception):
    pass


class CaseFailed(Exception):
    def __init__(self, case: Any, outcome: Outcome) -> None:
        super().__init__(outcome.message)
        self.case = case
        self.outcome = outcome

    def __reduce__(self) -> tuple:  # copied and pickled with its case and outcome
        return (CaseFailed, (self.case, self.outcome))


class Suite(abc.ABC):
    """A set of named checks of one invariance property.

    A suite describes itself to the rest of maskcheck through its class attributes, so a
    new suite is one module and one entry point (docs/writing-a-suite.md): nothing else
    lists suites by name.
    """

    name: ClassVar[str]
    summary: ClassVar[str]  # one line, for ``maskcheck list`` and the report
    #: where it runs and is reported among the others, lowest first (ties by name); the
    #: built-ins use 10-70, so a suite of another package runs after them by default
    order: ClassVar[int] = 1000
    #: "mask" (what each position may read) or "state" (packed rows, caches, checkpoints)
    kind: ClassVar[str] = "mask"
    #: audited by the architecture sweep on every model type built from a config; each of
    #: its verdicts then has a plain-transformers check in scripts/sweep/reproduce_finding.py,
    #: and scripts/noise_floor.py measures its checks on clean models
    in_sweep: ClassVar[bool] = False
    #: whether :meth:`effective_mask` draws which inputs influence which outputs
    draws_effective_mask: ClassVar[bool] = False
    #: the check that measures whether rows of one batch read each other; it runs first,
    #: alone, and cases of every check share forwards only when it passed (harness/engine/batching.py)
    batching_gate: ClassVar[str | None] = None
    #: the checks that measure whether a position reads anything after it (the later
    #: tokens' values, whether any follow); once all of them passed, the suites after this
    #: one stack unpadded rows of other lengths, extended with later tokens (harness/engine/batching.py)
    extension_gate: ClassVar[tuple[str, ...]] = ()
    #: whether its checks run on every call path too (harness/adapters/paths.py), besides
    #: the canonical one; False for a suite whose answer the path cannot change
    call_paths: ClassVar[bool] = True
    #: whether its checks also run on a low-precision model's float32 copy (the
    #: ``float32_twin`` path: the mask's structure at float32's thresholds), even where
    #: ``call_paths`` is False; False for a suite that compares weights, not outputs
    float32_twin: ClassVar[bool] = True
    #: whether the other call paths replay each check's longest case (and then its richest
    #: short ones), or its richest short cases only. A long row is what shows a path's
    #: branch past a window or a position table, and one unpadded long row tests every
    #: earlier position at once, which the causal and cache checks replay on every path;
    #: False for a suite whose property is the batch's structure (padding, segments,
    #: masked labels), which a short case shows on a path as well as a long one (a long
    #: row per check and path would add a third to a ``ci`` audit's tokens: docs/performance.md)
    long_rows_on_paths: ClassVar[bool] = True

    @abc.abstractmethod
    def not_applicable(self, capabilities: Capabilities) -> str | None:
        """Why this suite does not apply to a model, or None when it does."""

    @abc.abstractmethod
    def checks(self, adapter: Adapter, context: RunContext) -> list[Check | CheckResult]:
        """The checks to run; a :class:`CheckResult` stands for a check decided up front
        (``not_applicable`` with its reason)."""

    def conclude(self, results: list[CheckResult]) -> None:
        """Revise verdicts that one check's result explains in another (runs after every check)."""

    def effective_mask(self, adapter: Adapter, context: RunContext, **sizes: int) -> tuple[Any, Any]:
        """``(influence, expected)`` for the effective-mask picture, where :attr:`draws_effective_mask`."""
        raise NotImplementedError(f"the {self.name} suite draws no effective mask")


def case_to_dict(case: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(case):
        return dataclasses.asdict(case)  # type: ignore[arg-type]
    return {"value": repr(case)}


@st.composite
def _example(draw: st.DrawFn, case: st.SearchStrategy[Any], size: int) -> tuple:
    # The simplest example, which runs first, is told by two marks of 0 in a row (MARK).
    if draw(MARK) == 0 and draw(MARK) == 0:
        return (draw(case),)
    cases = []
    for index in range(size):
        with reaching(index == 0):  # the first case takes one long length (harness/engine/strategies.py)
            cases.append(draw(case))
    return tuple(cases)


def example_strategy(case: st.SearchStrategy[Any], size: int) -> st.SearchStrategy[tuple]:
    """``size`` cases per Hypothesis example, the first of them reaching past the short
    lengths, except in the simplest example, which holds only the minimal case. A
    fixed-size example would hold ``size`` copies of it there, whose drawing costs as
    much as random cases (a sixth of an audit's Hypothesis time) while the memo answers
    all but one. The shrinker may take a failing example there when its first case is the
    one that fails, which only makes the report shorter. One case per example needs no
    mark: the simplest example is the minimal case anyway."""
    return _example(case, size) if size > 1 else st.tuples(case)


def split_examples(cases: int, max_examples: int | None) -> tuple[int, int]:
    """(Hypothesis examples, cases per example) for a check that should see ``cases`` cases.

    Hypothesis's first example is its simplest, which holds the minimal case alone
    (:func:`example_strategy`). The random cases follow, at most
    :data:`CASES_PER_EXAMPLE` to an example and spread evenly (20 cases: the minimal one,
    then 2 examples of 10; 8: the minimal one, then one example of 8). A check with a
    small case space (``max_examples``) draws one case per example.
    """
    if max_examples is not None:
        return max(1, min(cases, max_examples)), 1
    if cases <= 1:
        return 1, 1
    random_examples = -(-cases // CASES_PER_EXAMPLE)
    return 1 + random_examples, -(-cases // random_examples)


def run_check(check: Check, context: RunContext) -> tuple[CheckResult, int, CaseFailed | None]:
    """Run one check over Hypothesis-drawn cases; returns its result, the number of distinct
    cases evaluated, and the failing (shrunk) case with its outcome, if any."""
    return CheckRun(check, context).run()


def run_check_keeping_cases(
    check: Check, context: RunContext
) -> tuple[CheckResult, int, CaseFailed | None, list[tuple[Any, CallLog]]]:
    """:func:`run_check`, and the distinct cases it evaluated, in order, each with the log of
    the model calls it made (harness/adapters/paths.py:CallLog)."""
    run = CheckRun(check, context)
    return (*run.run(), run.evaluated_cases())


def replay_first(
    check: Check, context: RunContext, cases: list, shrink_examples: int | None = None, seen: list | None = None
) -> tuple[CheckResult, int, CaseFailed | None]:
    """:func:`run_check` on ``cases`` instead of drawn ones: they are evaluated in plain
    Python, and one that fails is shrunk by Hypothesis as a replayed case is (:class:`CheckRun`).

    Hypothesis shrinks only what its own search finds, and a search of ``context.examples``
    cases (a call path's share) may miss a failure a replayed case showed; then, with
    ``shrink_examples`` larger, the check searches again with that many (the canonical
    run's count, which drew the replayed cases), so the failure is reported shrunk.
    ``seen`` receives the distinct cases the replay evaluated, each with the log of its
    model calls, as :func:`run_check_keeping_cases` returns them. The replayed cases stand
    as the check's draws in a ``drawn`` of the replay's own, never in the caller's, whose
    draws of the same strategy other checks replay."""
    context = replace(context, drawn={})
    run = CheckRun(check, context)
    context.drawn[(id(check.strategy), run.examples, run.per_example)] = DrawnCases(check.strategy, [list(cases)])
    run.planned = len(cases)
    result, evaluated, failure = run.run()
    if seen is not None:
        seen.extend(run.evaluated_cases())
    if failure is not None and run.unshrunk and shrink_examples and shrink_examples > context.examples:
        wider = CheckRun(check, replace(context, examples=shrink_examples))
        shrunk, more, found = wider.run()
        if found is not None and not wider.unshrunk:
            return shrunk, evaluated + more, found
        evaluated += more
    return result, evaluated, failure


def informative_cases(cases: list, count: int, longest: bool = True) -> list:
    """Up to ``count`` of a check's evaluated ``cases`` that exercise it most for their cost.

    First, with ``longest``, the largest case (by the sum of its integer fields: rows,
    lengths, padding): it holds the longest row, and one forward at length L tests every
    earlier position; without it, a kind's cases larger than its median come last. Then,
    for each combination of the case's text fields (the padding side ...) not chosen yet,
    the case with the most items in its list fields (rows, segments, chunks), the cheapest
    of those: a bug on one call path shows where the path changes the batch, and the
    length is already tested. Then the same order again, until ``count``. A case that
    differs from a chosen one only in its seed (the token ids) is never chosen: it calls
    the model with the same shapes, padding and positions, which is what a path or a
    backward changes, so fewer than ``count`` cases may come back."""
    if count <= 0 or not cases:
        return []

    def size(case: Any) -> int:
        return sum(_integers(value) for name, value in _fields(case).items() if name != "seed")

    def items(case: Any) -> int:
        return sum(len(value) for value in _fields(case).values() if isinstance(value, (list, tuple)))

    def kind(case: Any) -> tuple:
        return tuple(sorted((k, v) for k, v in _fields(case).items() if isinstance(v, str)))

    def structure(case: Any) -> tuple:
        return tuple((k, v) for k, v in _fields(case).items() if k != "seed")

    if longest:
        chosen = [max(cases, key=size)]
        structured = sorted(cases, key=lambda case: (-items(case), size(case)))
    else:  # a kind's long cases last: the richest short case of each kind is replayed
        chosen, sizes = [], collections.defaultdict(list)
        for case in cases:
            sizes[kind(case)].append(size(case))
        median = {key: statistics.median_low(values) for key, values in sizes.items()}
        structured = sorted(cases, key=lambda case: (size(case) > median[kind(case)], -items(case), size(case)))
    for case in structured:  # the richest, cheapest case of each other kind
        if len(chosen) < count and all(kind(case) != kind(other) for other in chosen):
            chosen.append(case)
    for case in structured:  # then the richest left
        if len(chosen) < count and all(structure(case) != structure(other) for other in chosen):
            chosen.append(case)
    return chosen


def _fields(case: Any) -> dict[str, Any]:
    """A case's own fields, not copied (:func:`case_to_dict` deep-copies them for reports)."""
    if dataclasses.is_dataclass(case):
        return {f.name: getattr(case, f.name) for f in dataclasses.fields(case)}
    return {"value": repr(case)}


def _integers(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)):
        return sum(_integers(item) for item in value)
    return 0


class CheckRun:
    """One check's run: Hypothesis draws examples of cases, the model answers each case once.

    A case seen before (a random case that repeats one, or the minimal case; in shrinking,
    the passing cases beside the failing one and the failing one itself) is answered from
    the memo, not by the model again. Once a failure is found, shrinking runs until the
    shrink budget or the suite's time limit; after that every new case answers as passing,
    so Hypothesis's shrinker stops making progress and reports the smallest failure so far.
    """

    def __init__(self, check: Check, context: RunContext) -> None:
        self.check = check
        self.context = context
        self.evaluated = 0
        self.worst: tuple[tuple[int, float], Any, Outcome] | None = None  # (rank, case, outcome)
        self.memo: dict[Any, Outcome] = {}
        self.cases: dict[Any, Any] = {}  # memo key -> the case
        self.calls: dict[Any, CallLog] = {}  # memo key -> the model calls the case made
        self.failures: list[CaseFailed] = []  # in the order found: while shrinking, each smaller than the last
        self.shrink_started: float | None = None
        self.stopped_by: str | None = None  # what stopped the shrinking early
        self.examples, self.per_example = split_examples(context.examples, check.max_examples)
        self.planned = (self.examples - 1) * self.per_example + 1  # the first example is the minimal case alone
        self.generated: list[list[Any]] = []
        self.unshrunk = False  # a replayed failure Hypothesis's search did not find again

    def run(self) -> tuple[CheckResult, int, CaseFailed | None]:
        key = (id(self.check.strategy), self.examples, self.per_example)
        shared = self.context.drawn.get(key)
        replayed: CaseFailed | None = None
        try:
            if shared is None:
                self.search()
                self.context.drawn[key] = DrawnCases(self.check.strategy, self.generated)
            else:
                try:
                    # Replayed examples are all known: their cases can share forwards across examples.
                    self.evaluate_all([case for cases in shared.examples for case in cases])
                except CaseFailed as failure:
                    replayed = failure
                    self.search()  # draws the same examples again and shrinks the failure
        except CaseFailed as found:
            failure = self.shorter(found) if self.context.shrink else found
            if self.stopped_by is not None:
                failure.outcome.message += (
                    f" (shrinking stopped by {self.stopped_by} after {time.monotonic() - self.shrink_started:.0f} s:"
                    " the smallest failing case found by then)"
                )
            return _failed(self.check, failure), self.evaluated, failure
        except AdapterError as exc:
            return CheckResult(self.check.name, "error", str(exc)), self.evaluated, None
        except TimeLimitReached:
            reason = f"the suite's time limit (--timeout) was reached after {self.evaluated} case(s)"
            return CheckResult(self.check.name, "not_run", reason), self.evaluated, None
        if replayed is not None:  # Hypothesis drew other examples this time: report the case unshrunk
            self.unshrunk = True
            return _failed(self.check, replayed), self.evaluated, replayed
        return self.verdict(), self.evaluated, None

    def shorter(self, failure: CaseFailed) -> CaseFailed:
        """The failure with each row of its ``*_lengths`` fields as short as still fails.

        Hypothesis's shrinker cannot take a length drawn from the long range
        (strategies.short_or_long) back into the short one when the shortest length passes:
        the long draw's choices then decode as that shortest length. So a failure that needs
        two tokens stays at the long range's first length (9 tokens for a prompt). Here each
        row's length is tried from the shortest the strategy drew (its minimal example's) up
        to its own, the others kept, and the first that still fails is taken: a few cases,
        evaluated on a failing check only."""
        case = failure.case
        if not dataclasses.is_dataclass(case) or self.shrinking_stopped():
            return failure
        for name in (f.name for f in dataclasses.fields(case) if f.name.endswith("lengths")):
            lengths = getattr(failure.case, name)
            if not (isinstance(lengths, tuple) and all(isinstance(n, int) for n in lengths)):
                continue
            drawn = [n for seen in self.cases.values() for n in getattr(seen, name, ()) or ()]
            shortest = min(drawn, default=min(lengths))
            for row, length in enumerate(lengths):
                for tried in range(shortest, length):
                    candidate = replace(failure.case, **{name: lengths[:row] + (tried,) + lengths[row + 1 :]})
                    try:
                        self.evaluate_all([candidate])
                    except CaseFailed as smaller:
                        failure, lengths = smaller, getattr(smaller.case, name)
                        break
                    except AdapterError:  # a length the case cannot take: try the next
                        continue
                    if self.shrinking_stopped():
                        return failure
        return failure

    def search(self) -> None:
        """Hypothesis's generation, then its shrinking: no explicit examples, no database, no target()."""
        phases = [Phase.generate, Phase.shrink] if self.context.shrink else [Phase.generate]
        # Not a list with unique_by: Hypothesis fills one that starts from its simplest
        # choices with near-minimal cases (all right-padded single rows, say), a poor sample
        # when a profile draws only one or two examples.
        strategy = example_strategy(self.check.strategy, self.per_example)
        evaluate = self.evaluate_drawn

        # Hypothesis hashes the source of the test it runs on every run (its database key): a
        # one-line test keeps that hash cheap.
        def prop(cases: list[Any]) -> None: evaluate(cases)  # fmt: skip

        # The profile brings no deadline, no database and no health checks (harness/engine/profiles.py).
        settings_ = settings(profile_settings(self.context.profile), max_examples=self.examples, phases=phases)
        test = settings_(given(strategy)(prop))
        with without_local_constants():  # the cases must not depend on which modules are imported
            hypothesis_seed(self.context.seed)(test)()

    def evaluate_drawn(self, cases: list[Any]) -> None:
        self.generated.append(cases)
        self.evaluate_all(cases)

    def evaluate_all(self, cases: list[Any]) -> None:
        """Answer each case in order; raise :class:`CaseFailed` at the first failing one."""
        if self.failures and self.shrinking_stopped() and not self.from_memo(cases):
            return  # no new case: the shrinker sees no progress and reports the smallest failure so far
        licensed = self.context.batch_cases and self.check.batchable
        with stacking(licensed), extending(licensed and self.context.extend_rows):
            self.evaluate_in_order(cases, licensed)

    def evaluate_in_order(self, cases: list[Any], licensed: bool) -> None:
        """:meth:`evaluate_all`'s cases: together first where stacking is ``licensed``, then
        each in order (from the memo where it was evaluated together)."""
        if licensed:
            self.evaluate_together(cases)
        for case in cases:
            key = _memo_key(case)
            outcome = self.memo.get(key)
            if outcome is None:
                self.raise_past_deadline()
                # the harness's own tensor work needs no autograd either
                with torch.inference_mode(), logging_calls(self.log_of(key, case)):
                    outcome = self.memo[key] = self.check.outcome(case)
                self.record(case, outcome)
            if outcome.status == "fail":
                if not self.failures:
                    self.shrink_started = time.monotonic()
                self.failures.append(CaseFailed(case, outcome))
                raise self.failures[-1]

    def evaluate_together(self, cases: list[Any]) -> None:
        """Evaluate the cases not in the memo in lockstep, their forwards stacked; what one
        of them raises is raised when its turn comes, as evaluating them in order would."""
        fresh = list({key: case for case in cases if (key := _memo_key(case)) not in self.memo}.items())
        if len(fresh) < 2:
            return
        self.raise_past_deadline()
        logs = [self.log_of(key, case) for key, case in fresh]
        with torch.inference_mode():
            evaluations = []
            for (_, case), log in zip(fresh, logs):
                with logging_calls(log):  # a check that evaluates at once calls the model here
                    evaluations.append(self.check.evaluate(case))
            results = run_together(evaluations, logs=logs)
        for (key, case), result in zip(fresh, results):
            if isinstance(result, BaseException):
                break  # evaluated again in order, where it raises
            self.memo[key] = result
            self.record(case, result)
            if result.status == "fail":
                break

    def evaluated_cases(self) -> list[tuple[Any, CallLog]]:
        """The distinct cases evaluated, in order, each with the log of its model calls."""
        return [(self.cases[key], self.calls[key]) for key in self.memo]

    def log_of(self, key: Any, case: Any) -> CallLog:
        """The log of ``case``'s model calls (the calls of an evaluation retried alone add to it)."""
        if key not in self.calls:
            self.cases[key], self.calls[key] = case, CallLog()
        return self.calls[key]

    def from_memo(self, cases: list[Any]) -> bool:
        """Whether the memo decides these cases as evaluating them in order would (up to the first failure)."""
        for case in cases:
            outcome = self.memo.get(_memo_key(case))
            if outcome is None:
                return False
            if outcome.status == "fail":
                return True
        return True

    def shrinking_stopped(self) -> bool:
        """Whether the time limit or the shrink budget has run out after a failure was found."""
        if self.stopped_by is None:
            now = time.monotonic()
            if self.context.deadline is not None and now > self.context.deadline:
                self.stopped_by = "the suite's time limit (--timeout)"
            elif self.context.shrink_seconds is not None and now - self.shrink_started > self.context.shrink_seconds:
                self.stopped_by = f"the shrink budget of {self.context.shrink_seconds:g} s"
        return self.stopped_by is not None

    def raise_past_deadline(self) -> None:
        if self.context.deadline is not None and time.monotonic() > self.context.deadline:
            raise TimeLimitReached

    def record(self, case: Any, outcome: Outcome) -> None:
        self.evaluated += 1
        if self.context.on_case is not None:
            # a failure's shrinking evaluates cases past the plan
            self.context.on_case(self.check.name, self.evaluated, max(self.planned, self.evaluated))
        rank = (SEVERITY[outcome.status], outcome.ratio)
        if self.worst is None or rank > self.worst[0]:
            self.worst = (rank, case, outcome)

    def verdict(self) -> CheckResult:
        """The result of a run in which no case failed: the worst case seen, pass or warn."""
        if self.worst is None:
            return CheckResult(self.check.name, "not_run", "no case was evaluated")
        _, case, outcome = self.worst
        if outcome.status == "warn":
            return outcome.result(self.check.name, "warn", outcome.message, case_to_dict(case))
        worst = outcome.message or f"worst {outcome.max_diff:.3g} vs threshold {outcome.threshold:.3g}"
        result = outcome.result(self.check.name, "pass", f"{self.evaluated} cases; {worst}", case_to_dict(case))
        result.positions = []  # a passing check points at no positions
        return result


def _memo_key(case: Any) -> Any:
    """The case itself (cases are frozen dataclasses: hashing one is cheaper than its
    repr); its repr for a case type that cannot be hashed."""
    try:
        hash(case)
    except TypeError:
        return repr(case)
    return case


def _failed(check: Check, failure: CaseFailed) -> CheckResult:
    outcome = failure.outcome
    blob = next((note.strip() for note in getattr(failure, "__notes__", []) if "@reproduce_failure" in note), None)
    if blob:
        outcome.detail["hypothesis_blob"] = blob
    return outcome.result(check.name, "fail", outcome.message, case_to_dict(failure.case), hypothesis_blob=blob)
