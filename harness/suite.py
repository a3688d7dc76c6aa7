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

from .adapters.base import Adapter, AdapterError, Capabilities
from .profiles import profile_settings
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
    on_case: Callable[[str, int, int], None] | None = None  # (check, cases done, cases planned), for a progress display


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

    @property
    def ratio(self) -> float:
        if self.threshold <= 0:
            return float("inf") if self.max_diff > 0 else 0.0
        return self.max_diff / self.threshold


@dataclass
class Check:
    name: str
    evaluate: Callable[[Any], Outcome]
    strategy: st.SearchStrategy[Any]
    # The most examples worth drawing; a check with a small case space says so.
    max_examples: int | None = None


#: cases per Hypothesis example: its per-example cost (about 1 ms) is shared by this many cases
CASES_PER_EXAMPLE = 4


class ProbeError(Exception):
    """A probe that cannot run on a model (no tokenizer, no synthetic vocabulary ...); one line for the user."""


class TimeLimitReached(Exception):
    pass


class CaseFailed(Exception):
    def __init__(self, case: Any, outcome: Outcome) -> None:
        super().__init__(outcome.message)
        self.case = case
        self.outcome = outcome


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


def case_to_dict(case: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(case):
        return dataclasses.asdict(case)  # type: ignore[arg-type]
    return {"value": repr(case)}


def run_check(check: Check, context: RunContext) -> tuple[CheckResult, int, CaseFailed | None]:
    """Run one check over Hypothesis-drawn cases; returns its result, the number of cases
    evaluated, and the failing (shrunk) case with its outcome, if any."""
    evaluated = 0
    worst_seen: dict[str, Any] = {}

    def prop(cases: list[Any]) -> None:
        nonlocal evaluated
        for case in cases:
            if context.deadline is not None and time.monotonic() > context.deadline:
                raise TimeLimitReached
            with torch.inference_mode():  # the harness's own tensor work needs no autograd either
                outcome = check.evaluate(case)
            evaluated += 1
            if context.on_case is not None:
                context.on_case(check.name, evaluated, planned)
            key = (SEVERITY[outcome.status], outcome.ratio)
            if not worst_seen or key > worst_seen["key"]:
                worst_seen.update(key=key, case=case, outcome=outcome)
            if outcome.status == "fail":
                raise CaseFailed(case, outcome)

    examples = context.examples if check.max_examples is None else min(context.examples, check.max_examples)
    per_example = CASES_PER_EXAMPLE if check.max_examples is None and examples >= CASES_PER_EXAMPLE else 1
    strategy = st.lists(check.strategy, min_size=per_example, max_size=per_example)
    examples = -(-examples // per_example)
    planned = examples * per_example
    # No explicit examples, no database to reuse, no target(): generation alone, then shrinking.
    phases = [Phase.generate]
    if context.shrink:
        phases.append(Phase.shrink)
    # The profile brings no deadline, no database and no health checks (harness/profiles.py).
    test = settings(profile_settings(context.profile), max_examples=max(1, examples), phases=phases)(given(strategy)(prop))
    test = hypothesis_seed(context.seed)(test)
    try:
        test()
    except CaseFailed as failure:
        o = failure.outcome
        blob = next((note.strip() for note in getattr(failure, "__notes__", []) if "@reproduce_failure" in note), None)
        if blob:
            o.detail["hypothesis_blob"] = blob
        result = CheckResult(check.name, "fail", o.message, o.max_diff, o.floor, o.threshold, o.positions, case_to_dict(failure.case), blob)
        return result, evaluated, failure
    except AdapterError as exc:
        return CheckResult(check.name, "error", str(exc)), evaluated, None
    except TimeLimitReached:
        return CheckResult(check.name, "not_run", f"the suite's time limit (--timeout) was reached after {evaluated} case(s)"), evaluated, None
    if not worst_seen:
        return CheckResult(check.name, "not_run", "no case was evaluated"), evaluated, None
    o: Outcome = worst_seen["outcome"]
    status = "warn" if o.status == "warn" else "pass"
    if status == "warn":
        message = o.message
    else:
        message = f"{evaluated} cases; " + (o.message or f"worst {o.max_diff:.3g} vs threshold {o.threshold:.3g}")
    case = case_to_dict(worst_seen["case"])
    return CheckResult(check.name, status, message, o.max_diff, o.floor, o.threshold, o.positions if status == "warn" else [], case), evaluated, None
