"""The seeded bugs as pytest parameters: one built from an optional test subject (torchtune,
which lives in a test environment of its own) is marked with that subject's name and skipped,
with the reason, where it is not installed."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from maskcheck.reference_models.mutants import MUTANTS


def mutant_params(names: Iterable[str] | None = None) -> list:
    params = []
    for name in sorted(MUTANTS) if names is None else names:
        mutant = MUTANTS[name]
        marks = []
        if mutant.requires is not None:
            marks = [
                getattr(pytest.mark, mutant.requires),
                pytest.mark.skipif(bool(mutant.missing()), reason=str(mutant.missing())),
            ]
        params.append(pytest.param(name, marks=marks, id=name))
    return params
