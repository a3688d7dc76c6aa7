"""needle: retrieval of one key->value needle over a grid of context length x needle depth.

Each cell holds ``samples`` prompts with fresh random keys and values (seeded). A sample
counts as retrieved when the value is the greedy answer (``is_greedy``, teacher-forced).
Summary: per-cell accuracy with Wilson intervals, ``effective_length`` (the longest length
whose accuracy over depths reaches the threshold, every shorter one too), ``reach`` (the
largest query-to-needle distance with accuracy at the threshold), mean rank, margin and
retrieval gain, and the lengths beyond what the model was trained for or declares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ...harness.adapters.base import Adapter
from .common import (
    ProbeResult,
    Progress,
    beyond,
    default_lengths,
    haystack_for,
    sample_row,
)
from .haystacks import Templates
from .summaries import cell, effective_length, reach

DEFAULT_DEPTHS = tuple(i / 10 for i in range(11))


def run_needle(
    adapter: Adapter,
    lengths: Sequence[int] | None = None,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    samples: int = 4,
    seed: int = 0,
    threshold: float = 0.9,
    text: str | None = None,
    progress: Progress | None = None,
    templates: Templates | dict[str, str] | None = None,
    generate: bool = False,
) -> ProbeResult:
    """``templates`` change the needle, question and answer text (models with a tokenizer);
    ``generate`` also decodes every answer for real and records ``generated_match``."""
    haystack = haystack_for(adapter, text, templates)
    lengths = list(lengths or default_lengths(adapter))
    total, done = len(lengths) * len(depths) * samples, 0
    rows: list[dict[str, Any]] = []
    for length in lengths:
        for depth in depths:
            for i in range(samples):
                sample = haystack.needle(length, depth, seed * 1_000_003 + length * 1009 + round(depth * 100) * 31 + i)
                rows.append(sample_row(adapter, sample, generate, length=length, depth=depth, sample=i))
                done += 1
                if progress:
                    progress(done, total)
    grid = {
        f"{length}/{depth:g}": cell(sum(r["is_greedy"] for r in cell_rows), len(cell_rows))
        for length in lengths
        for depth in depths
        for cell_rows in [[r for r in rows if r["length"] == length and r["depth"] == depth]]
    }
    by_length = {
        length: sum(r["is_greedy"] for r in rows if r["length"] == length)
        / max(1, sum(r["length"] == length for r in rows))
        for length in lengths
    }
    summary = {
        "lengths": lengths,
        "depths": list(depths),
        "samples": samples,
        "threshold": threshold,
        "accuracy": sum(r["is_greedy"] for r in rows) / len(rows),
        "accuracy_by_length": {str(k): v for k, v in by_length.items()},
        "min_accuracy_over_depths": {
            str(length): min(grid[f"{length}/{d:g}"]["accuracy"] for d in depths) for length in lengths
        },
        "effective_length": effective_length(by_length, threshold),
        "reach": reach([(r["distance"], r["is_greedy"]) for r in rows], threshold),
        "mean_rank": sum(r["rank"] for r in rows) / len(rows),
        "mean_margin": sum(r["margin"] for r in rows) / len(rows),
        "mean_gain": sum(r["gain"] for r in rows) / len(rows),
        "flags": {str(length): flag for length in lengths if (flag := beyond(adapter, length))},
    }
    if generate:
        summary["generated_accuracy"] = sum(r["generated_match"] for r in rows) / len(rows)
    return ProbeResult("needle", adapter.spec, summary, grid, rows)


def draw_heatmap(result: ProbeResult, path: Path) -> Path:
    """Accuracy over context length (x) and needle depth (y), as in the well-known needle charts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    lengths, depths = result.summary["lengths"], result.summary["depths"]
    values = np.array([[result.grid[f"{length}/{depth:g}"]["accuracy"] for length in lengths] for depth in depths])
    figure, axes = plt.subplots(figsize=(max(5.0, 1.2 + 0.9 * len(lengths)), 0.9 + 0.35 * len(depths)))
    image = axes.imshow(values, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    samples = result.summary["samples"]
    for (y, x), value in np.ndenumerate(values):
        # Dark text on the light middle of the colour map, white on its dark ends: readable on every cell.
        colour = "black" if 0.2 < value < 0.85 else "white"
        axes.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=7, color=colour)
    labels = [f"{length}{'*' if str(length) in result.summary['flags'] else ''}" for length in lengths]
    axes.set_xticks(range(len(lengths)), labels)
    axes.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    axes.set_xlabel("context length (tokens; * beyond trained/declared length)")
    axes.set_ylabel("needle depth")
    axes.set_title(
        f"needle retrieval: {result.model}\neffective length {result.summary['effective_length']}, reach {result.summary['reach']}; {samples} prompts per cell",
        fontsize=9,
    )
    figure.colorbar(image, ax=axes, label="accuracy (greedy answer = value)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
