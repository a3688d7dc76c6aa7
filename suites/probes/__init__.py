"""Long-context probes: they measure what a model retrieves from long context.

``needle`` (a grid of context length x needle depth, drawn as a heatmap) and
``lost_in_the_middle`` (accuracy by the slot of the relevant item, drawn as a curve).
Probes measure; they pass or fail only against a threshold the user sets.
"""

from __future__ import annotations

from typing import Any, Callable

from .common import ProbeError, ProbeResult
from .lost_in_the_middle import draw_curve, run_lost_in_the_middle
from .needle import draw_heatmap, run_needle

Probe = tuple[Callable[..., ProbeResult], Callable[..., Any]]  # (runner, picture)

# Registered in the ``maskcheck.probes`` entry-point group (pyproject.toml); harness loads
# them through maskcheck.harness.engine.registry, never by importing this package by name.
NEEDLE: Probe = (run_needle, draw_heatmap)
LOST_IN_THE_MIDDLE: Probe = (run_lost_in_the_middle, draw_curve)

__all__ = ["LOST_IN_THE_MIDDLE", "NEEDLE", "ProbeError", "ProbeResult", "run_lost_in_the_middle", "run_needle"]
