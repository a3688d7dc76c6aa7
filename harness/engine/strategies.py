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


def short_or_long(low: int, short: int, longest: int | None) -> st.SearchStrategy[int]:
    """A length from ``low .. short`` or, where ``longest`` allows, from ``short + 1 .. longest``
    in about one draw in four: one pair of forwards at length L tests every earlier position
    at once, so a mask wrong only in long sequences is seen, while the short cases keep the
    search cheap (a long case costs its tokens). Shrinking tries the short branch first, so
    a failure that holds in a short sequence is reported short. ``longest`` None: short only."""
    if longest is None:
        return st.integers(low, max(low, short))
    short = max(low, min(short, longest))
    if longest <= short:
        return st.integers(low, short)
    brief = st.integers(low, short)
    return st.one_of(brief, brief, brief, st.integers(short + 1, longest))
