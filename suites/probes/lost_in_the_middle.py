"""lost_in_the_middle: accuracy by the slot of the relevant item among k.

k key->value items are spread evenly over the context; one is asked about, and its slot
moves across all k positions while the others stay. A closed-book control (the asked
item removed) shows what the model answers without it. Summary: accuracy per slot with
Wilson intervals, the closed-book accuracy, and ``edge_vs_middle`` (the lower of the first
and last slots' accuracy minus the worst interior slot's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...harness.adapters.base import Adapter
from .common import ProbeResult, Progress, beyond, haystack_for, sample_row
from .haystacks import Templates
from .summaries import cell, edge_vs_middle


def run_lost_in_the_middle(
    adapter: Adapter,
    length: int | None = None,
    items: int = 6,
    samples: int = 8,
    seed: int = 0,
    text: str | None = None,
    progress: Progress | None = None,
    templates: Templates | dict[str, str] | None = None,
    generate: bool = False,
) -> ProbeResult:
    """``templates`` change the item and question text (models with a tokenizer);
    ``generate`` also decodes every answer for real and records ``generated_match``."""
    haystack = haystack_for(adapter, text, templates)
    caps = adapter.capabilities
    length = length or caps.trained_length or min(caps.max_length or 512, 512)
    rows: list[dict[str, Any]] = []
    total = items * samples
    for slot in range(items):
        for i in range(samples):
            # The same seed per sample index: only the asked slot changes between slots.
            sample = haystack.items(length, items, slot, seed * 1_000_003 + i)
            rows.append(sample_row(adapter, sample, generate, slot=slot, sample=i))
            if progress:
                progress(len(rows), total)
    grid = {str(slot): cell(sum(r["is_greedy"] for r in rows if r["slot"] == slot), samples) for slot in range(items)}
    by_slot = [grid[str(slot)]["accuracy"] for slot in range(items)]
    summary = {
        "length": length,
        "items": items,
        "samples": samples,
        "accuracy_by_slot": by_slot,
        "edge_vs_middle": edge_vs_middle(by_slot),
        # The control: the asked item removed. What the model still answers is a guess.
        "closed_book_accuracy": sum(r["closed_book_greedy"] for r in rows) / len(rows),
        "mean_gain": sum(r["gain"] for r in rows) / len(rows),
        "flags": {str(length): flag} if (flag := beyond(adapter, length)) else {},
    }
    if generate:
        summary["generated_accuracy"] = sum(r["generated_match"] for r in rows) / len(rows)
    return ProbeResult("lost-in-the-middle", adapter.spec, summary, grid, rows)


def draw_curve(result: ProbeResult, path: Path) -> Path:
    """Accuracy by slot of the relevant item, with Wilson intervals: the U of lost-in-the-middle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = result.summary["items"]
    slots = list(range(1, items + 1))
    accuracy = [result.grid[str(s - 1)]["accuracy"] for s in slots]
    low = [a - result.grid[str(s - 1)]["low"] for s, a in zip(slots, accuracy)]
    high = [result.grid[str(s - 1)]["high"] - a for s, a in zip(slots, accuracy)]
    figure, axes = plt.subplots(figsize=(5.5, 3.4))
    axes.errorbar(slots, accuracy, yerr=[low, high], marker="o", capsize=3, label="item present")
    axes.axhline(
        result.summary["closed_book_accuracy"], color="grey", linestyle="--", label="closed book (item removed)"
    )
    axes.set_ylim(-0.05, 1.05)
    axes.set_xticks(slots)
    axes.set_xlabel(f"slot of the relevant item (1 = first of {items})")
    axes.set_ylabel("accuracy (greedy answer = value)")
    axes.set_title(
        f"lost in the middle: {result.model}\nedge vs middle {result.summary['edge_vs_middle']:.2f}, {result.summary['length']} tokens",
        fontsize=9,
    )
    axes.grid(alpha=0.3)
    axes.legend(loc="center", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
