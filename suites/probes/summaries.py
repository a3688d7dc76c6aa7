"""Summaries of probe results: accuracy with Wilson intervals, effective length, reach, edge vs middle."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable


def wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (sound at 0/n and n/n, unlike the normal one)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def cell(successes: int, trials: int) -> dict[str, float | int]:
    low, high = wilson(successes, trials)
    return {"accuracy": successes / trials if trials else 0.0, "n": trials, "low": low, "high": high}


def effective_length(accuracy_by_length: dict[int, float], threshold: float) -> int | None:
    """The longest length whose accuracy (over all depths) reaches ``threshold``, provided every
    shorter length does too: a model that fails at 256 but passes at 512 is not trusted at 512."""
    best = None
    for length in sorted(accuracy_by_length):
        if accuracy_by_length[length] < threshold:
            break
        best = length
    return best


def reach(results: Iterable[tuple[int, bool]], threshold: float, bucket: int = 4) -> int | None:
    """The largest query-to-needle distance (in tokens, bucketed) at which accuracy reaches ``threshold``,
    with every nearer bucket reaching it too."""
    totals: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for distance, hit in results:
        key = distance // bucket
        totals[key][0] += int(hit)
        totals[key][1] += 1
    best = None
    for key in sorted(totals):
        hits, n = totals[key]
        if hits / n < threshold:
            break
        best = key * bucket + bucket - 1
    return best


def edge_vs_middle(accuracy_by_slot: list[float]) -> float | None:
    """min(first slot, last slot) minus the worst interior slot: high when a model finds what
    sits at the edges and loses what sits in the middle (lost in the middle)."""
    if len(accuracy_by_slot) < 3:
        return None
    return min(accuracy_by_slot[0], accuracy_by_slot[-1]) - min(accuracy_by_slot[1:-1])
