"""How a check draws its cases: distinct cases, draws shared between checks, each case evaluated once."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import maskcheck.harness.engine.suite as engine
from maskcheck.harness.engine.profiles import examples_of
from maskcheck.harness.engine.suite import (
    Check,
    Outcome,
    RunContext,
    run_check,
    split_examples,
)
from maskcheck.harness.engine.tolerance import tolerance_for
from maskcheck.suites.padding import PaddedCase, padded_cases


def recording(strategy: Any, fails: Callable[[Any], bool] = lambda case: False) -> tuple[Check, list[Any]]:
    """A check that records every case it is asked to evaluate and fails where ``fails`` says."""
    seen: list[Any] = []

    def evaluate(case: Any) -> Outcome:
        seen.append(case)
        if fails(case):
            return Outcome("fail", 1.0, 0.0, 0.5, message="seeded failure")
        return Outcome("pass")

    return Check("recording", evaluate, strategy), seen


def ci_context() -> RunContext:
    return RunContext(tolerance=tolerance_for("cpu", "float32"), examples=20, profile="ci")


def long_row(case: PaddedCase) -> bool:
    return max(case.lengths) >= 5


@pytest.mark.parametrize(
    ("cases", "max_examples", "expected"),
    [
        (20, None, (3, 10)),
        (8, None, (2, 8)),
        (25, None, (4, 9)),
        (200, None, (21, 10)),
        (1, None, (1, 1)),
        (20, 3, (3, 1)),
    ],
)
def test_cases_are_split_evenly_into_examples_after_the_minimal_one(
    cases: int, max_examples: int | None, expected: tuple[int, int]
) -> None:
    assert split_examples(cases, max_examples) == expected


@pytest.mark.parametrize(("profile", "cases"), [("dev", 8), ("ci", 20)])
def test_a_check_sees_the_minimal_case_then_the_profiles_count_of_varied_cases(profile: str, cases: int) -> None:
    """The dev profile's 8 cases fill one example: they must be a random sample, not
    near-copies of the minimal case (what unique lists of Hypothesis's simplest choices give)."""
    check, seen = recording(padded_cases(12))
    context = RunContext(tolerance=tolerance_for("cpu", "float32"), examples=cases, profile=profile)
    result, evaluated, _ = run_check(check, context)
    assert result.status == "pass"
    assert evaluated == len(seen) == len(set(seen)) == cases + 1
    assert seen[0] == PaddedCase(lengths=(1,), extra=1, side="right", seed=0)
    random = seen[1:]
    assert {c.side for c in random} == {"left", "right"}
    assert len({(c.lengths, c.extra) for c in random}) >= len(random) - 1


def test_the_quick_profile_sees_each_checks_minimal_case_alone() -> None:
    check, seen = recording(padded_cases(12))
    context = RunContext(tolerance=tolerance_for("cpu", "float32"), examples=examples_of("quick"), profile="quick")
    result, evaluated, _ = run_check(check, context)
    assert result.status == "pass"
    assert evaluated == 1 and seen == [PaddedCase(lengths=(1,), extra=1, side="right", seed=0)]


def test_checks_given_one_strategy_object_draw_once_and_see_the_same_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    context, strategy = ci_context(), padded_cases(12)
    first, seen_first = recording(strategy)
    run_check(first, context)
    monkeypatch.setattr(engine, "given", lambda *a, **k: pytest.fail("Hypothesis drew the shared cases again"))
    second, seen_second = recording(strategy)
    result, evaluated, _ = run_check(second, context)
    assert result.status == "pass" and evaluated == 21
    assert seen_second == seen_first
    # An equal strategy that is another object draws for itself.
    third, _ = recording(padded_cases(12))
    with pytest.raises(pytest.fail.Exception):
        run_check(third, context)


def test_a_failure_among_shared_cases_is_shrunk_as_if_drawn_alone() -> None:
    shared_context, strategy = ci_context(), padded_cases(12)
    run_check(recording(strategy)[0], shared_context)
    shared, seen = recording(strategy, long_row)
    result, _, failure = run_check(shared, shared_context)
    alone, _ = recording(padded_cases(12), long_row)
    alone_result, _, alone_failure = run_check(alone, ci_context())
    assert result.status == alone_result.status == "fail"
    assert failure is not None and alone_failure is not None
    assert failure.case == alone_failure.case
    assert failure.case.lengths == (5,), failure.case  # shrunk to the smallest failing row
    assert result.hypothesis_blob and result.hypothesis_blob == alone_result.hypothesis_blob
    # Shrinking re-runs whole examples; the model is asked about each distinct case once.
    assert len(seen) == len(set(seen))


def test_cases_drawn_field_by_field_shrink_to_the_simplest() -> None:
    from dataclasses import dataclass

    from hypothesis import find, settings
    from hypothesis import strategies as st

    from maskcheck.harness.engine.strategies import case_strategy

    @dataclass(frozen=True)
    class Case:
        lengths: tuple[int, ...]
        side: str
        seed: int

    strategy = case_strategy(
        Case,
        lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
        side=st.sampled_from(["right", "left"]),
        seed=st.integers(0, 99),
    )
    # Any case at all shrinks to the simplest one; a condition on some fields leaves the others simplest.
    assert find(strategy, lambda case: True) == Case((1,), "right", 0)
    assert find(strategy, lambda case: len(case.lengths) == 3 and case.side == "left") == Case((1, 1, 1), "left", 0)
    # Among ten cases, as a check draws them, the cases that do not matter shrink to the simplest.
    cases = find(
        st.tuples(*[strategy] * 10),
        lambda drawn: any(sum(case.lengths) >= 12 for case in drawn),
        settings=settings(derandomize=True, database=None),
    )
    failing = [case for case in cases if sum(case.lengths) >= 12]
    assert len(failing) == 1 and failing[0].side == "right" and failing[0].seed == 0
    assert [case for case in cases if case not in failing] == [Case((1,), "right", 0)] * 9


def test_the_simplest_example_holds_the_minimal_case_alone_and_the_others_are_full() -> None:
    from hypothesis import Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from maskcheck.harness.engine.suite import example_strategy

    examples: list[tuple] = []

    @hypothesis_seed(0)
    @settings(max_examples=6, database=None, phases=[Phase.generate])
    @given(example_strategy(padded_cases(12), 10))
    def record(example: tuple) -> None:
        examples.append(example)

    record()
    assert examples[0] == (PaddedCase(lengths=(1,), extra=1, side="right", seed=0),)
    assert [len(example) for example in examples[1:]] == [10] * 5


def drawn_as_ci_draws(seed: int) -> list[tuple]:
    """The examples a check of twenty cases draws: the minimal case, then two examples of ten."""
    from hypothesis import Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from maskcheck.harness.engine.suite import example_strategy

    examples: list[tuple] = []

    @hypothesis_seed(seed)
    @settings(max_examples=3, database=None, phases=[Phase.generate])
    @given(example_strategy(padded_cases(12, longest=200), 10))
    def record(example: tuple) -> None:
        examples.append(example)

    record()
    return examples


def test_every_random_example_reaches_one_long_length_in_its_first_case_and_no_other() -> None:
    """Long rows cost their tokens: one per example sees past the short range, the rest stay short."""
    for seed in range(10):
        examples = drawn_as_ci_draws(seed)
        assert len(examples) == 3 and max(examples[0][0].lengths) <= 12  # the minimal case
        for first, *others in examples[1:]:
            assert max(first.lengths) > 12 and sorted(first.lengths)[-2:-1] <= [12], (seed, first)
            assert all(max(case.lengths) <= 12 for case in others), (seed, others)


def test_a_padded_case_with_a_long_row_holds_that_row_alone() -> None:
    """Short rows padded to a long row's length would be mostly padding slots: a long case
    is its one row, padded by the case's extra slots; short cases keep up to three rows."""
    rows = set()
    for seed in range(10):
        for first, *others in drawn_as_ci_draws(seed)[1:]:
            assert len(first.lengths) == 1 and first.lengths[0] > 12, (seed, first)
            rows.update(len(case.lengths) for case in others)
    assert rows == {1, 2, 3}


def test_a_spent_shrink_budget_reports_the_smallest_failing_case_found_by_then() -> None:
    """Shrinking stops once the budget is spent: the check still fails, on a case no larger
    than the first failure, and says why it may not be minimal."""
    check, seen = recording(padded_cases(12), fails=long_row)
    context = RunContext(tolerance=tolerance_for("cpu", "float32"), examples=20, profile="ci", shrink_seconds=0.0)
    result, _, failure = run_check(check, context)
    assert result.status == "fail" and failure is not None
    assert "shrinking stopped by the shrink budget of 0 s" in result.message
    first_failing = next(case for case in seen if long_row(case))
    assert max(failure.case.lengths) <= max(first_failing.lengths)
    unbounded, _, shrunk = run_check(check, ci_context())
    assert unbounded.status == "fail" and "shrinking stopped" not in unbounded.message
    assert max(shrunk.case.lengths) == 5  # the budget is what stopped the first one short


def test_the_cases_a_seed_draws_do_not_depend_on_the_local_modules_the_process_imported(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Hypothesis draws about one integer in twenty from constants of imported local modules
    (the host repository's code under the plugin, an editable maskcheck): maskcheck's
    searches run without that pool, so the same seed draws the same cases whatever was imported."""
    import importlib

    from hypothesis import strategies as st

    strategy = st.tuples(st.integers(1, 12), st.integers(0, 2**16), st.integers(0, 3))

    def drawn() -> list[Any]:
        check, seen = recording(strategy)
        run_check(check, RunContext(tolerance=tolerance_for("cpu", "float32"), examples=200, profile="thorough"))
        return seen

    before = drawn()
    # A local module whose literals cover every value the strategy can draw.
    (tmp_path / "host_constants.py").write_text(
        "VALUES = ["
        + ", ".join(str(v) for v in range(0, 2**16 + 1, 97))
        + ", "
        + ", ".join(map(str, range(13)))
        + "]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("host_constants")
    assert drawn() == before
    from hypothesis.internal.conjecture import providers

    assert providers._get_local_constants.__name__ == "_get_local_constants"  # the host's own draws keep their pool


def test_the_constants_allowed_from_the_empty_pool_are_kept_between_searches_and_never_shown_to_the_host() -> None:
    """Every maskcheck search filters the same empty pool: what it allowed is kept for the
    next search, while the host's own draws see neither it nor lose their pool's cache."""
    from hypothesis.internal.conjecture import providers

    from maskcheck.harness.engine.profiles import without_local_constants

    cache = providers.CONSTANTS_CACHE.cache
    cache["host's key"] = ("allowed from the host's pool",)
    with without_local_constants():
        assert "host's key" not in cache
        cache["maskcheck's key"] = ("allowed from the empty pool",)
    assert not cache  # left as the original block left it: cleared
    with without_local_constants():
        assert cache.get("maskcheck's key") == ("allowed from the empty pool",)
    assert not cache


def test_the_other_paths_replay_the_longest_case_then_the_richest_cheapest_case_of_each_other_kind() -> None:
    """One long row tests every earlier position on a path; the other padding side is
    replayed on its case with the most rows, not on another long one."""
    from maskcheck.harness.engine.suite import informative_cases

    longest = PaddedCase(lengths=(200,), extra=1, side="right", seed=0)
    rich_left = PaddedCase(lengths=(3, 5, 2), extra=1, side="left", seed=0)
    rich_long_left = PaddedCase(lengths=(150, 9, 4), extra=2, side="left", seed=0)
    rich_right = PaddedCase(lengths=(2, 4, 1), extra=3, side="right", seed=0)
    cases = [PaddedCase(lengths=(1,), extra=1, side="left", seed=0), rich_long_left, longest, rich_left, rich_right]
    assert informative_cases(cases, 2) == [longest, rich_left]
    assert informative_cases(cases, 3) == [longest, rich_left, rich_right]
    assert informative_cases(cases, 0) == [] and informative_cases([], 2) == []


def test_a_structural_suite_replays_its_richest_short_cases_on_the_other_paths() -> None:
    """Padding, packing and masked labels are a batch's structure, which a short case shows:
    their checks replay no long row on the other paths while a shorter case of its kind exists."""
    from maskcheck.harness.engine.registry import suite_names
    from maskcheck.harness.engine.suite import informative_cases

    short_left = PaddedCase(lengths=(3, 5), extra=1, side="left", seed=0)
    long_left = PaddedCase(lengths=(150, 9, 4), extra=2, side="left", seed=0)
    alone_left = PaddedCase(lengths=(1,), extra=1, side="left", seed=0)
    long_right = PaddedCase(lengths=(200,), extra=1, side="right", seed=0)
    cases = [alone_left, long_left, long_right, short_left]
    assert informative_cases(cases, 2, longest=False) == [short_left, long_right]  # the right side has only a long case
    assert informative_cases(cases, 3, longest=False) == [short_left, long_right, alone_left]
    assert informative_cases(cases, 2) == [long_right, long_left]  # the causal and cache checks keep the long row
    structural = suite_names(lambda suite: not suite.long_rows_on_paths)
    assert set(structural) == {"padding", "packing", "loss_masking", "cross_attention"}


class TwoChecks(engine.Suite):
    """A suite of a forward check and a costly check that replays its cases (a gradient check)."""

    name, summary = "two_checks", "a forward check and a replaying one"

    def __init__(self, checks: list[Check]) -> None:
        self.planned = checks

    def not_applicable(self, capabilities: Any) -> None:
        return None

    def checks(self, adapter: Any, context: RunContext) -> list[Check]:
        return self.planned


@pytest.mark.parametrize("leaks_left", [False, True])
def test_a_replaying_check_evaluates_the_forward_checks_most_informative_cases_and_shrinks_a_failure_there(
    leaks_left: bool,
) -> None:
    """A gradient check evaluates the longest case the forward check beside it evaluated and
    the richest of the other padding side, not draws of its own, which can all be
    right-padded; a failure among them is found again in the forward check's draws and shrunk."""
    from dataclasses import replace
    from types import SimpleNamespace

    from maskcheck.harness.audits.runner import run_suite
    from maskcheck.harness.engine.suite import informative_cases

    strategy = padded_cases(12, longest=60)
    forward, forward_seen = recording(strategy)
    backward, backward_seen = recording(strategy, fails=lambda case: leaks_left and case.side == "left")
    backward = replace(backward, name="backward", max_examples=5, replays=3)
    context = replace(ci_context(), examples=10, path_examples=0)
    adapter = SimpleNamespace(  # the runner's view of an adapter; float64: no failure of it is judged again in float64
        capabilities=SimpleNamespace(dtype="float64"), release_state=lambda: None, release_float64_twin=lambda: None
    )
    result = run_suite(TwoChecks([forward, backward]), adapter, context)
    replayed = informative_cases(list(dict.fromkeys(forward_seen)), 3)
    assert {case.side for case in replayed} == {"left", "right"}
    assert max(max(case.lengths) for case in replayed) > 12  # the long row the forward check drew
    checked = {check.name: check for check in result.checks}
    if not leaks_left:
        assert backward_seen == replayed and checked["backward"].status == "pass"
    else:
        assert checked["backward"].status == "fail"
        assert checked["backward"].case == {"lengths": (1,), "extra": 1, "side": "left", "seed": 0}


def test_cases_that_differ_only_in_their_token_ids_are_replayed_once() -> None:
    """Another seed calls the model with the same shapes, padding and positions, which is
    what a call path or a backward changes: such a case is replayed once, even when fewer
    than the count asked for come back."""
    from maskcheck.harness.engine.suite import informative_cases

    first = PaddedCase(lengths=(5,), extra=1, side="left", seed=0)
    again = PaddedCase(lengths=(5,), extra=1, side="left", seed=7)
    other = PaddedCase(lengths=(5,), extra=2, side="left", seed=7)
    assert informative_cases([first, again], 2) == [first]
    assert informative_cases([first, again, other], 2) == [other, first]


@pytest.mark.parametrize("leaks_left", [False, True])
def test_where_every_forward_check_failed_a_replaying_check_searches_their_draws_itself(leaks_left: bool) -> None:
    """A failing forward check stops before its draws are done, so there is nothing to
    replay: the gradient check searches the same draws itself (its first check's count of
    examples, all of them while it passes), not a few of its own, and a left-padding leak
    is found and shrunk there."""
    from dataclasses import replace
    from types import SimpleNamespace

    from maskcheck.harness.audits.runner import run_suite

    strategy = padded_cases(12, longest=60)
    forward, _ = recording(strategy, fails=lambda case: True)
    backward, backward_seen = recording(strategy, fails=lambda case: leaks_left and case.side == "left")
    backward = replace(backward, name="backward", max_examples=5, replays=3)
    context = replace(ci_context(), examples=10, path_examples=0)
    adapter = SimpleNamespace(  # the runner's view of an adapter; float64: no failure of it is judged again in float64
        capabilities=SimpleNamespace(dtype="float64"), release_state=lambda: None, release_float64_twin=lambda: None
    )
    result = run_suite(TwoChecks([forward, backward]), adapter, context)
    checked = {check.name: check for check in result.checks}
    assert checked["recording"].status == "fail"
    if not leaks_left:
        assert checked["backward"].status == "pass" and len(set(backward_seen)) == 11  # the minimal case and 10
    else:
        assert checked["backward"].status == "fail"
        assert checked["backward"].case == {"lengths": (1,), "extra": 1, "side": "left", "seed": 0}
