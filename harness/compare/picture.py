"""A picture of where two implementations part: relative difference per module and position."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from .layers import FirstDifference


def draw_parting(found: FirstDifference, path: str | Path, title: str) -> Path:
    """Write a PNG: one row per matched module in the order they finish (embeddings at the
    top, the output head at the bottom), one column per position of the call; the colour is
    log10 of the relative difference |A - B| / max |A|; the first differing module is marked
    and the threshold rounding allows is drawn on the colour bar. For a backward that parts
    the rows are the gradients at the modules' outputs, in the order the backward makes them
    (the output head at the top), and the axis says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not found.profile:
        raise ValueError("no module's output is laid out over the call's positions: nothing to draw")
    names = [name for name, _ in found.profile]
    table = torch.tensor([values for _, values in found.profile], dtype=torch.float64)  # [modules, T]
    shown = torch.log10(table.clamp(min=1e-12))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height = min(14.0, 1.5 + 0.18 * len(names))
    figure, axis = plt.subplots(figsize=(max(5.0, 1.8 + 0.45 * table.shape[1]), height), constrained_layout=True)
    image = axis.imshow(shown.numpy(), cmap="magma", vmin=-12, vmax=0, aspect="auto")
    axis.set_yticks(range(len(names)), names, fontsize=6)
    axis.set_xticks(range(table.shape[1]))
    axis.set_xlabel("position")
    if found.backward:
        axis.set_ylabel("gradient at the module's output, in backward order", fontsize=7)
    if found.a_name in names:
        row = names.index(found.a_name)
        axis.axhline(row, color="cyan", linewidth=1.2)
        axis.annotate(
            "first differing module" + (" going backward" if found.backward else ""),
            (table.shape[1] - 0.5, row),
            color="cyan",
            fontsize=7,
            ha="right",
            va="bottom",
        )
    bar = figure.colorbar(image, ax=axis)
    bar.set_label("log10 relative difference")
    bar.ax.axhline(torch.log10(torch.tensor(found.threshold)).item(), color="cyan", linewidth=2)
    axis.set_title("\n".join(textwrap.shorten(line, 70) for line in title.splitlines()), fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
