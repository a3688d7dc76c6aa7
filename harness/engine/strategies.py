"""Hypothesis strategies for cases, built to be cheap to draw.

On a small model Hypothesis's drawing costs as much as the harness's own work per case,
so the strategies avoid what makes a draw dear (docs/performance.md has the figures).

Variable-length fields stay ``st.lists``. Drawing the size first and then the elements
saves a choice per element, but the shrinker then cannot drop an element without
shifting every later choice: asked for row lengths summing to at least 12 in one of ten
cases, it reached the shortest answer, ``(3, 9)``, from 4 of 10 seeds (else ``(1, 2, 9)``)
where lists reach it from 20 of 30, and it took longer to get there. A shrunk case is
what a user reads first, so it is worth the few milliseconds an audit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, TypeVar

from hypothesis import strategies as st

CaseT = TypeVar("CaseT")


@st.composite
def _fields(
    draw: st.DrawFn, case_type: Callable[..., Any], items: tuple[tuple[str, st.SearchStrategy[Any]], ...]
) -> Any:
    return case_type(**{name: _frozen(draw(strategy)) for name, strategy in items})


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def case_strategy(case_type: Callable[..., CaseT], **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[CaseT]:
    """``st.builds(case_type, **fields)``: the fields drawn in the given order, without
    ``builds``' per-draw bookkeeping (two fifths of drawing a case). A drawn list becomes a
    tuple, so cases stay hashable (``.map(tuple)`` would cost a draw of its own). The
    composite is defined once, here: ``@st.composite`` inspects its function's source on
    every call."""
    return _fields(case_type, tuple(fields.items()))


#: While an example of several cases is drawn (harness/engine/suite.py): a one-item list,
#: True while the case being drawn may still take its one long length. None elsewhere: a
#: check that draws one case per example draws each length long in about one draw in four.
_REACH: ContextVar[list[bool] | None] = ContextVar("maskcheck_reach", default=None)

#: A drawn mark: 0 in Hypothesis's simplest example. Random examples draw 0 too, as a
#: boundary value (1.7% of 880 measured), so two marks of 0 in a row tell the simplest
#: example (none of the 880).
MARK = st.integers(0, 2**16)


@contextmanager
def reaching(reach: bool = True) -> Iterator[None]:
    """The case drawn inside this block takes one long length (``reach``) or none: with
    ``reach`` the first :func:`short_or_long` it draws comes from the long range."""
    token = _REACH.set([reach])
    try:
        yield
    finally:
        _REACH.reset(token)


@st.composite
def _length(
    draw: st.DrawFn, brief: st.SearchStrategy[int], long: st.SearchStrategy[int], mixed: st.SearchStrategy[int]
) -> int:
    reach = _REACH.get()
    if reach is None:
        return draw(mixed)
    if reach[0]:
        reach[0] = False
        # Long unless both marks are 0, which a random example draws about once in 3,000
        # (MARK) and the shrinker reaches in two steps: a failure
        # that needs no long row shrinks to a short one, as with one length in four. Both
        # are always drawn, so zeroing one leaves the choices after it where they were.
        marks = draw(MARK), draw(MARK)
        if any(marks):
            # The largest of three draws: past three quarters of the long range in 58% of
            # the examples (a length tests every earlier position at once).
            return max(draw(long), draw(long), draw(long))
    return draw(brief)


def short_or_long(low: int, short: int, longest: int | None) -> st.SearchStrategy[int]:
    """A length from ``low .. short``, or from ``short + 1 .. longest`` once in the first
    case of every example of several cases (:func:`reaching`): one forward at length L
    tests every earlier position at once, so a mask wrong only in long sequences is seen
    in every example, while the other cases stay short (a long case costs its tokens).
    The shrinker can take the long length back to the short range, so a failure that
    holds in a short sequence is reported short. Drawn outside an example of several
    cases (a check of one case per example), a length is long in about one draw in four
    and shrinks to the short range first. ``longest`` None or at most ``short``: short only."""
    if longest is None:
        return st.integers(low, max(low, short))
    short = max(low, min(short, longest))
    if longest <= short:
        return st.integers(low, short)
    brief, long = st.integers(low, short), st.integers(short + 1, longest)
    return _length(brief, long, st.one_of(brief, brief, brief, long))
