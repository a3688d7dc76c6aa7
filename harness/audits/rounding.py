"""A float32 failure near its threshold, judged once more with the model in float64.

A shape-changing comparison allows rounding in proportion to the compared outputs'
magnitude, but rounding grows with the magnitudes inside the model: a two-label
classifier's log-probabilities carry the rounding of a wide hidden state, and multi-head
latent attention's intermediates are larger than its outputs. So a difference a few
thresholds over the bar may be rounding, and no threshold can tell: confirmed leaks of
transformers architectures sit at 1.2x and 1.4x theirs. Precision can. The failing check's
shrunk case is evaluated again through the suite's own check of that name, on a float64
copy of the weights, on the path it failed on: a behaviour keeps its size there and fails
again; rounding shrinks 2**29-fold and passes. That is the rule the architecture sweep
confirms its findings by (scripts/sweep/reproduce_finding.py), applied in the audit.

Only a float32 model's failure within :data:`NEAR` thresholds is judged again (every seeded
bug fails far above that), once per failing check, never per case of its search. A failure
that stands keeps its message as it was, so a reproduction bundle's replay, which judges in
the model's own precision, tells the same story; so does a model that cannot be copied or run
in float64. Only a failure that turns out rounding changes: it passes, saying why.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..adapters.base import Adapter
from ..adapters.paths import PATHS
from ..engine.suite import Check, CheckResult, RunContext
from ..engine.tolerance import tolerance_for
from ..report.reproduction import FailedCheck

#: a failure within this many thresholds of the bar is judged again in float64
NEAR = 4.0


def near_the_bar(result: CheckResult) -> bool:
    """A failure by a finite difference over its threshold, within :data:`NEAR` of it (a failure
    by a missing difference, an encoder that reads nothing ahead, is no rounding question)."""
    if result.status != "fail" or result.max_diff is None or not result.threshold:
        return False
    return math.isfinite(result.max_diff) and result.threshold < result.max_diff <= NEAR * result.threshold


def judged_in_float64(
    suite: Any, adapter: Adapter, context: RunContext, result: CheckResult, failure: FailedCheck
) -> CheckResult:
    """``result`` judged again on ``failure``'s case in float64 (module docstring): a pass that
    replaces it where the difference was rounding, else ``result`` as it was."""
    if adapter.capabilities.dtype != "float32" or not near_the_bar(result):
        return result
    context64 = dataclasses.replace(
        context,
        tolerance=tolerance_for(adapter.capabilities.device, "float64"),
        dtype="float64",
        batch_cases=False,
        extend_rows=False,
        drawn={},
        decided={},
    )
    try:
        twin = adapter.float64_twin().on_path(PATHS[failure.path])
        # A suite of its own: a suite keeps what its checks measured for its conclude (the
        # pooled output's condition, a loss's fitted smoothing), which planning again would replace.
        planned = type(suite)().checks(twin, context64)
        check = next(c for c in planned if isinstance(c, Check) and c.name == result.name)
        with torch.inference_mode():
            outcome = check.outcome(failure.case)
    except Exception:  # noqa: BLE001 - a model that does not run in float64 keeps its float32 verdict
        return result
    if outcome.status == "fail":  # it keeps its size: the model's, not rounding
        return result
    return dataclasses.replace(
        result,
        status="pass",
        message=(
            f"rounding, not a leak: the shrunk case differed by {result.max_diff:.3g} in float32 (threshold "
            f"{result.threshold:.3g}), and by {outcome.max_diff:.3g} with the model in float64 (threshold "
            f"{outcome.threshold:.3g})"
        ),
        positions=[],
    )
