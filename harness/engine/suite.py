"""What a suite is, and how one of its checks runs under Hypothesis.

A suite is a set of named checks of one invariance property. A check has a
Hypothesis strategy that draws a *case* (structure plus an integer seed for token
ids, so shrinking minimises batch size, lengths and positions) and a function that
evaluates one case to an :class:`Outcome`. A failing case is shrunk by Hypothesis
and reported with its outcome.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from hypothesis import Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ..adapters.base import Adapter, AdapterError, Capabilities
from .batching import run_alone, run_together
from .profiles import profile_settings, without_local_constants
from .tolerance import Tolerance
from .verdict import SEVERITY, CheckResult


@dataclass
class RunContext:
    tolerance: Tolerance
    dtype: str = "float32"
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
    # (suite, check) -> run_check's answer, for a check run before its suite (the batching gate)
    decided: dict[tuple[str, str], tuple] = field(default_factory=dict)
    # Hypothesis's examples per strategy object, kept from a check that passed, for the
    # next check given the same strategy (see Check).
    drawn: dict[tuple[int, int, int], "DrawnCases"] = field(default_factory=dict)


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
    table: list[dict[str, Any]] = field(
        default_factory=list
    )  # rows a report shows as a table (the variants a layout was scored under)

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
    check's memo) and shrinks the failure. On the tiny reference model Hypothesis's drawing
    costs about 0.2 ms a drawn case (some ten choices; harness.engine.strategies) against forwards
    of 0.7 ms.
    """

    name: str
    evaluate: Callable[[Any], Any]  # an Outcome, or an evaluation that asks for logits (harness.engine.batching)
    strategy: st.SearchStrategy[Any]
    # The most examples worth drawing; a check with a small case space says so.
    max_examples: int | None = None
    # False for a check whose cases must each have their forwards to themselves (the one
    # that measures whether rows of a batch read each other).
    batchable: bool = True

    def outcome(self, case: Any) -> Outcome:
        """The outcome of one case, each forward it asks for run on its own."""
        return run_alone(self.evaluate(case))


@dataclass
class DrawnCases:
    strategy: st.SearchStrategy[Any]  # kept alive, so its id() is not reused while it is a key
    examples: list[list[Any]]


#: the most random cases drawn in one Hypothesis example: its per-example cost (about
#: 0.26 ms on this project's 2-core CPU, beside 0.6 ms per search) is shared by up to
#: this many cases
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
    name: ClassVar[str]
    summary: ClassVar[str]

    @abc.abstractmethod
    def not_applicable(self, capabilities: Capabilities) -> str | None:
        """Why this suite does not apply to a model, or None when it does."""

    @abc.abstractmethod
    def checks(self, adapter: Adapter, context: RunContext) -> list[Check | CheckResult]:
        """The checks to run; a :class:`CheckResult` stands for a check decided up front
        (``not_applicable`` with its reason)."""

    def conclude(self, results: list[CheckResult]) -> None:
        """Revise verdicts that one check's result explains in another (runs after every check)."""


def case_to_dict(case: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(case):
        return dataclasses.asdict(case)  # type: ignore[arg-type]
    return {"value": repr(case)}


#: 0 in Hypothesis's simplest example, which runs first. Random examples draw 0 too, as
#: a boundary value (1.7% of 880 measured), so the simplest example is told by two draws
#: of 0 in a row (none of the 880).
_MARK = st.integers(0, 2**16)


@st.composite
def _example(draw: st.DrawFn, case: st.SearchStrategy[Any], size: int) -> tuple:
    if draw(_MARK) == 0 and draw(_MARK) == 0:
        return (draw(case),)
    return tuple(draw(case) for _ in range(size))


def example_strategy(case: st.SearchStrategy[Any], size: int) -> st.SearchStrategy[tuple]:
    """``size`` cases per Hypothesis example, except in the simplest example, which holds
    only the minimal case. A fixed-size example would hold ``size`` copies of it there,
    whose drawing costs as much as random cases (a sixth of an audit's Hypothesis time)
    while the memo answers all but one. The shrinker may take a failing example there
    when its first case is the one that fails, which only makes the report shorter. One
    case per example needs no mark: the simplest example is the minimal case anyway."""
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
    evaluated = 0
    worst_seen: dict[str, Any] = {}
    # A case seen before (a random case that repeats one, or the minimal case; in
    # shrinking, the passing cases beside the failing one and the failing one itself) is
    # answered from here, not by the model again.
    outcomes: dict[Any, Outcome] = {}
    # Failing cases in the order found: while shrinking, each is smaller than the one before.
    failures: list[CaseFailed] = []
    shrink_started: list[float] = []
    stopped: list[str] = []  # what stopped the shrinking early

    def evaluate_all(cases: list[Any]) -> None:
        if failures and shrinking_stopped() and not from_memo(cases):
            return  # no new case: the shrinker sees no progress and reports the smallest failure so far
        if context.batch_cases and check.batchable:
            evaluate_together(cases)
        for case in cases:
            key = _memo_key(case)
            outcome = outcomes.get(key)
            if outcome is None:
                if context.deadline is not None and time.monotonic() > context.deadline:
                    raise TimeLimitReached
                with torch.inference_mode():  # the harness's own tensor work needs no autograd either
                    outcome = outcomes[key] = check.outcome(case)
                record(case, outcome)
            if outcome.status == "fail":
                if not failures:
                    shrink_started.append(time.monotonic())
                failures.append(CaseFailed(case, outcome))
                raise failures[-1]

    def from_memo(cases: list[Any]) -> bool:
        """Whether the memo decides these cases as evaluating them in order would (up to the first failure)."""
        for case in cases:
            outcome = outcomes.get(_memo_key(case))
            if outcome is None:
                return False
            if outcome.status == "fail":
                return True
        return True

    def shrinking_stopped() -> bool:
        """Whether the time limit or the shrink budget has run out after a failure was found."""
        if stopped:
            return True
        now = time.monotonic()
        if context.deadline is not None and now > context.deadline:
            stopped.append("the suite's time limit (--timeout)")
        elif context.shrink_seconds is not None and now - shrink_started[0] > context.shrink_seconds:
            stopped.append(f"the shrink budget of {context.shrink_seconds:g} s")
        return bool(stopped)

    def evaluate_together(cases: list[Any]) -> None:
        """Evaluate the cases not in the memo in lockstep, their forwards stacked; what one
        of them raises is raised when its turn comes, as evaluating them in order would."""
        fresh = list({key: case for case in cases if (key := _memo_key(case)) not in outcomes}.items())
        if len(fresh) < 2:
            return
        if context.deadline is not None and time.monotonic() > context.deadline:
            raise TimeLimitReached
        with torch.inference_mode():
            results = run_together([check.evaluate(case) for _, case in fresh])
        for (key, case), result in zip(fresh, results):
            if isinstance(result, BaseException):
                break  # evaluated again in order, where it raises
            outcomes[key] = result
            record(case, result)
            if result.status == "fail":
                break

    def record(case: Any, outcome: Outcome) -> None:
        nonlocal evaluated
        evaluated += 1
        if context.on_case is not None:
            context.on_case(check.name, evaluated, planned)
        rank = (SEVERITY[outcome.status], outcome.ratio)
        if not worst_seen or rank > worst_seen["rank"]:
            worst_seen.update(rank=rank, case=case, outcome=outcome)

    examples, per_example = split_examples(context.examples, check.max_examples)
    planned = (examples - 1) * per_example + 1  # the first example is the minimal case alone
    # Not a list with unique_by: Hypothesis fills one that starts from its simplest
    # choices with near-minimal cases (all right-padded single rows, say), a poor sample
    # when a profile draws only one or two examples.
    strategy = example_strategy(check.strategy, per_example)
    generated: list[list[Any]] = []

    # Hypothesis hashes the source of the test it runs on every run (its database key): a
    # one-line test keeps that hash cheap (it cost 1 ms a check with the loop inlined).
    def prop(cases: list[Any]) -> None: generated.append(cases); evaluate_all(cases)  # fmt: skip

    def search() -> None:
        # No explicit examples, no database to reuse, no target(): generation alone, then shrinking.
        phases = [Phase.generate, Phase.shrink] if context.shrink else [Phase.generate]
        # The profile brings no deadline, no database and no health checks (harness/engine/profiles.py).
        test = settings(profile_settings(context.profile), max_examples=examples, phases=phases)(given(strategy)(prop))
        with without_local_constants():  # the cases must not depend on which modules are imported
            hypothesis_seed(context.seed)(test)()

    key = (id(check.strategy), examples, per_example)
    shared = context.drawn.get(key)
    replayed: CaseFailed | None = None
    try:
        if shared is None:
            search()
            context.drawn[key] = DrawnCases(check.strategy, generated)
        else:
            try:
                # Replayed examples are all known: their cases can share forwards across examples.
                evaluate_all([case for cases in shared.examples for case in cases])
            except CaseFailed as failure:
                replayed = failure
                search()  # draws the same examples again and shrinks the failure
    except CaseFailed as failure:
        if stopped:
            failure.outcome.message += f" (shrinking stopped by {stopped[0]} after {time.monotonic() - shrink_started[0]:.0f} s: the smallest failing case found by then)"
        return _failed(check, failure), evaluated, failure
    except AdapterError as exc:
        return CheckResult(check.name, "error", str(exc)), evaluated, None
    except TimeLimitReached:
        return (
            CheckResult(
                check.name, "not_run", f"the suite's time limit (--timeout) was reached after {evaluated} case(s)"
            ),
            evaluated,
            None,
        )
    if replayed is not None:  # Hypothesis drew other examples this time: report the case unshrunk
        return _failed(check, replayed), evaluated, replayed
    if not worst_seen:
        return CheckResult(check.name, "not_run", "no case was evaluated"), evaluated, None
    o: Outcome = worst_seen["outcome"]
    status = "warn" if o.status == "warn" else "pass"
    if status == "warn":
        message = o.message
    else:
        message = f"{evaluated} cases; " + (o.message or f"worst {o.max_diff:.3g} vs threshold {o.threshold:.3g}")
    case = case_to_dict(worst_seen["case"])
    return (
        CheckResult(
            check.name,
            status,
            message,
            o.max_diff,
            o.floor,
            o.threshold,
            o.positions if status == "warn" else [],
            case,
            positions_label=o.positions_label,
            table=o.table,
        ),
        evaluated,
        None,
    )


def _memo_key(case: Any) -> Any:
    """The case itself (cases are frozen dataclasses: hashing one is cheaper than its
    repr); its repr for a case type that cannot be hashed."""
    try:
        hash(case)
    except TypeError:
        return repr(case)
    return case


def _failed(check: Check, failure: CaseFailed) -> CheckResult:
    o = failure.outcome
    blob = next((note.strip() for note in getattr(failure, "__notes__", []) if "@reproduce_failure" in note), None)
    if blob:
        o.detail["hypothesis_blob"] = blob
    return CheckResult(
        check.name,
        "fail",
        o.message,
        o.max_diff,
        o.floor,
        o.threshold,
        o.positions,
        case_to_dict(failure.case),
        blob,
        o.positions_label,
        o.table,
    )
